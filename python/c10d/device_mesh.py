"""DeviceMesh: the ranks laid out as an n-dimensional array, with one process group per line
along each dimension (as torch.distributed.device_mesh). On CPU only: the groups use the
default group's backend (gloo or shm).

    mesh = c10d.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dist.all_reduce(x, group=mesh.get_group("tp"))   # with the rank beside this one
    mesh["dp"].size()                               # 2
    funcol.all_reduce(x, "sum", (mesh, 0))          # functional collectives take meshes too
"""

import sys
from typing import List, Optional, Tuple, Union

import numpy as np

from . import distributed_c10d as _c10d

__all__ = ["DeviceMesh", "init_device_mesh"]

_DeviceTypes = ("cpu",)


def _check_device_type(device_type: str) -> str:
    if device_type not in _DeviceTypes:
        raise _c10d._DistValueError(
            f"DeviceMesh: device type {device_type!r} is not supported; c10d runs on 'cpu'"
        )
    return device_type


class DeviceMesh:
    """The ranks of `mesh` (an array of distinct global ranks) with a process group for every
    line along every dimension. Every rank of the world constructs the same mesh, in the same
    order relative to its other new_group calls."""

    def __init__(
        self,
        device_type: str,
        mesh,
        *,
        mesh_dim_names: Optional[Tuple[str, ...]] = None,
        _init_backend: bool = True,
        _dim_groups=None,
    ):
        self.device_type = _check_device_type(device_type)
        array = np.array(mesh.tolist() if hasattr(mesh, "tolist") else mesh, dtype=np.int64)
        if array.ndim == 0:
            raise _c10d._DistValueError("DeviceMesh: the mesh needs at least one dimension")
        flat = array.reshape(-1).tolist()
        if len(set(flat)) != len(flat):
            raise _c10d._DistValueError(f"DeviceMesh: the mesh {array.tolist()} repeats ranks")
        world = _c10d.get_world_size()
        if flat and (min(flat) < 0 or max(flat) >= world):
            raise _c10d._DistValueError(
                f"DeviceMesh: the mesh {array.tolist()} has ranks outside 0..{world - 1}"
            )
        if mesh_dim_names is not None:
            mesh_dim_names = tuple(mesh_dim_names)
            if len(mesh_dim_names) != array.ndim:
                raise _c10d._DistValueError(
                    f"DeviceMesh: {len(mesh_dim_names)} mesh_dim_names for a mesh of "
                    f"{array.ndim} dimensions"
                )
            if len(set(mesh_dim_names)) != len(mesh_dim_names):
                raise _c10d._DistValueError(
                    f"DeviceMesh: mesh_dim_names {mesh_dim_names} repeat a name"
                )
        self._mesh = array
        self.mesh_dim_names = mesh_dim_names
        rank = _c10d.get_rank()
        where = np.argwhere(array == rank)
        self._coordinate = [int(c) for c in where[0]] if len(where) else None
        if _dim_groups is not None:
            self._dim_groups = list(_dim_groups)
        elif _init_backend:
            self._dim_groups = [self._make_dim_groups(d) for d in range(array.ndim)]
        else:
            self._dim_groups = [None] * array.ndim

    @property
    def mesh(self):
        """The ranks, as a torch tensor when torch is loaded (torch's DeviceMesh.mesh is one,
        and code written for it calls tensor methods), else as a numpy array."""
        torch = sys.modules.get("torch")
        return self._mesh.copy() if torch is None else torch.as_tensor(self._mesh)

    def _make_dim_groups(self, dim: int):
        """Creates the group of every line along `dim` (every rank creates all of them, in one
        order) and returns this rank's."""
        moved = np.moveaxis(self._mesh, dim, -1).reshape(-1, self._mesh.shape[dim])
        mine = None
        for line in moved.tolist():
            group = _c10d.new_group(line)
            if _c10d.get_rank() in line:
                mine = group
        return mine

    # --- dimensions ---

    def _dim(self, mesh_dim: Union[int, str, None]) -> int:
        if mesh_dim is None:
            if self._mesh.ndim != 1:
                raise _c10d._DistValueError(
                    f"DeviceMesh: this mesh has {self._mesh.ndim} dimensions; name one"
                )
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(
                    f"DeviceMesh: no dimension named {mesh_dim!r} "
                    f"(mesh_dim_names: {self.mesh_dim_names})"
                )
            return self.mesh_dim_names.index(mesh_dim)
        if not -self._mesh.ndim <= mesh_dim < self._mesh.ndim:
            raise _c10d._DistValueError(
                f"DeviceMesh: dimension {mesh_dim} of a mesh of {self._mesh.ndim} dimensions"
            )
        return mesh_dim % self._mesh.ndim

    @property
    def ndim(self) -> int:
        return int(self._mesh.ndim)

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(int(s) for s in self._mesh.shape)

    def size(self, mesh_dim: Union[int, str, None] = None) -> int:
        if mesh_dim is None:
            return int(self._mesh.size)
        return int(self._mesh.shape[self._dim(mesh_dim)])

    # --- this rank ---

    def get_rank(self) -> int:
        return _c10d.get_rank()

    def get_coordinate(self) -> Optional[List[int]]:
        """This rank's index along every dimension, or None when it is not in the mesh."""
        return list(self._coordinate) if self._coordinate is not None else None

    def get_local_rank(self, mesh_dim: Union[int, str, None] = None) -> int:
        dim = self._dim(mesh_dim)
        if self._coordinate is None:
            raise _c10d._DistValueError(f"DeviceMesh: rank {self.get_rank()} is not in the mesh")
        return self._coordinate[dim]

    # --- groups ---

    def get_group(self, mesh_dim: Union[int, str, None] = None):
        """The group of this rank's line along `mesh_dim` (optional for a 1-D mesh)."""
        dim = self._dim(mesh_dim)
        group = self._dim_groups[dim]
        if group is None:
            raise _c10d._DistValueError(
                f"DeviceMesh: rank {self.get_rank()} has no group along dimension {dim} "
                "(not in the mesh, or made with _init_backend=False)"
            )
        return group

    def get_all_groups(self) -> list:
        return [self.get_group(d) for d in range(self.ndim)]

    def __getitem__(self, names: Union[str, Tuple[str, ...]]) -> "DeviceMesh":
        """The sub-mesh of the named dimensions through this rank (its groups are this mesh's
        groups for those dimensions: no new groups)."""
        if isinstance(names, str):
            names = (names,)
        dims = [self._dim(n) for n in names]
        if not all(isinstance(n, str) for n in names) or len(set(dims)) != len(dims):
            raise KeyError(f"DeviceMesh: {names!r} must be distinct dimension names")
        if self._coordinate is None:
            raise _c10d._DistValueError(f"DeviceMesh: rank {self.get_rank()} is not in the mesh")
        index = tuple(slice(None) if d in dims else self._coordinate[d] for d in range(self.ndim))
        kept = [d for d in range(self.ndim) if d in dims]  # the slice's axes, in the mesh's order
        sub = np.transpose(self._mesh[index], [kept.index(d) for d in dims])  # in the named order
        return DeviceMesh(
            self.device_type,
            sub,
            mesh_dim_names=tuple(names),
            _dim_groups=[self._dim_groups[d] for d in dims],
        )

    # --- comparison and text ---

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, DeviceMesh)
            and self.device_type == other.device_type
            and self._mesh.shape == other._mesh.shape
            and bool((self._mesh == other._mesh).all())
            and self.mesh_dim_names == other.mesh_dim_names
        )

    def __hash__(self) -> int:
        return hash(
            (
                self.device_type,
                self._mesh.shape,
                tuple(self._mesh.reshape(-1).tolist()),
                self.mesh_dim_names,
            )
        )

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self._mesh.tolist()}{names})"


def init_device_mesh(
    device_type: str,
    mesh_shape: Tuple[int, ...],
    *,
    mesh_dim_names: Optional[Tuple[str, ...]] = None,
) -> DeviceMesh:
    """A mesh of every rank in order, shaped `mesh_shape` (its product must be the world
    size), with a group along each dimension. The default group must exist."""
    _check_device_type(device_type)
    shape = tuple(int(s) for s in mesh_shape)
    if mesh_dim_names is not None and len(tuple(mesh_dim_names)) != len(shape):
        raise _c10d._DistValueError(
            f"init_device_mesh: mesh_shape {shape} and mesh_dim_names {tuple(mesh_dim_names)} "
            "must have the same length"
        )
    world = _c10d.get_world_size()
    if int(np.prod(shape)) != world:
        raise _c10d._DistValueError(
            f"init_device_mesh: mesh_shape {shape} holds {int(np.prod(shape))} ranks but the "
            f"world has {world}"
        )
    return DeviceMesh(
        device_type, np.arange(world, dtype=np.int64).reshape(shape), mesh_dim_names=mesh_dim_names
    )

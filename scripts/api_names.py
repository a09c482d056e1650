#!/usr/bin/env python3
"""Lists the names of torch.distributed's c10d layer found in the seed documents and says which
exist in c10d; writes the table docs/api-names.md.

    PYTHONPATH=python python scripts/api_names.py [--seeds DIR] [--check]

Names come from the bindings (classes, their methods, properties and enum values, module
functions), from distributed_c10d.py (module-level definitions and the members of its public
classes) and from _functional_collectives.py (module-level definitions). Each gets a status:

- present: c10d has it;
- stub: c10d has it, but it does less than torch's (the reason is in STUBS below);
- gpu-only: a CUDA/NCCL/UCC/XCCL name; c10d has it where torch always exposes it, and using it
  raises an error that names the missing GPU support;
- n/a: torch machinery c10d has no counterpart for (tracing, meta kernels; see NOT_APPLICABLE);
- missing: none of the above.

tests/python/test_api_names.py reads the table: every name listed present, stub or gpu-only
must still resolve. --check fails when the table is not what this script would write.
"""

import argparse
import os
import re
import sys
import warnings
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "api-names.md")
BINDINGS = "000_cff6666fa84ab734.txt"
DISTRIBUTED = "001_0cb39413f7a7f871.txt"
DISTRIBUTED_OLD = "002_ad42cf7a9a359064.txt"
FUNCTIONAL = "003_0cc462fc15be2387.txt"
# Names only the older bindings (004, fragments of the file with comments) have: listed by
# hand, since its gaps leave members after a gap without their class.
OLDER_BINDINGS = ["TCPStore.collect_client_counters"]

# Names that exist but do less than torch's: name -> what differs.
STUBS: Dict[str, str] = {
    "Work.boxed": "returns the Work itself (no TorchScript IValue to box into)",
    "Work.unbox": "returns the Work boxed() returned",
    "ProcessGroup.boxed": "returns the group itself (no TorchScript IValue to box into)",
    "ProcessGroup.unbox": "returns the group boxed() returned",
    "Reducer._set_sparse_metadata": "recorded only",
    "Reducer._set_mixed_precision_param_dtype": "recorded only",
    "Reducer._delay_all_reduce": "recorded only: gradients are still reduced in backward",
    "Reducer._set_optimizer_in_backward": "recorded only",
    "Reducer._install_post_backward_futures": "recorded only",
    "Reducer._set_forward_pass_work_handle": "recorded only",
    "Reducer._remove_autograd_hooks": "recorded only: c10d's DDP registers hooks in Python",
    "_set_thread_isolation_mode": "recorded only: c10d groups are not tied to a thread",
    "TCPStore.collect_client_counters": "an empty dict: the client keeps no counters",
}

# Torch internals c10d has no use for: name -> why.
NOT_APPLICABLE: Dict[str, str] = {
    "_export_c_types": "torch's module bookkeeping",
    "_are_we_tracing": "dynamo/FX tracing",
    "_is_view_op": "FX tracing",
    "_FromTorchTensor": "tracing of AsyncCollectiveTensor",
    "traceable_collective_remaps": "dynamo's remapping of in-place collectives",
    "logger": "torch's module logger",
    "_DMAConnectivity": "CUDA DMA topology",
    "_detect_dma_connectivity": "CUDA DMA topology",
    "all_gather_multigpu": "removed from torch 2.x",
    "all_reduce_multigpu": "removed from torch 2.x",
    "broadcast_multigpu": "removed from torch 2.x",
    "reduce_multigpu": "removed from torch 2.x",
    "reduce_scatter_multigpu": "removed from torch 2.x",
    "_check_default_pg": "removed from torch 2.x",
    "_get_group_rank": "removed from torch 2.x",
}
META_KERNEL = re.compile(r"_meta$")

# Words that mark a name as needing a GPU library.
GPU_WORDS = re.compile(
    r"NCCL|UCC|XCCL|CUDA|Symmetric|IntraNode|(?:^|[._])(?:nccl|ucc|xccl|cuda|"
    r"symmetric|intra_node)"
)
GPU_MACROS = ("USE_C10D_NCCL", "USE_C10D_UCC", "USE_C10D_XCCL", "USE_CUDA", "NCCL_HAS")


def _strip_numbers(text: str) -> str:
    """The code of an xref listing (each line prefixed with its number)."""
    return "\n".join(re.sub(r"^\d+ ?", "", line) for line in text.splitlines()[1:])


def _gpu_lines(code: str) -> List[bool]:
    """For each line of the bindings, whether it sits inside a GPU-only #if block."""
    flags, conditions = [], []
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("#if"):
            conditions.append(any(m in stripped for m in GPU_MACROS))
        elif stripped.startswith("#endif") and conditions:
            conditions.pop()
        flags.append(any(conditions))
    return flags


def _blanked(code: str) -> str:
    """`code` with raw strings (docstrings) and // comments blanked out, lines kept."""
    code = re.sub(r'R"\((.*?)\)"', lambda m: '""' + "\n" * m.group(0).count("\n"), code, flags=re.S)
    return re.sub(r"(?m)^\s*//.*$", "", code)


CLASS_DECL = re.compile(
    r"(?:py::class_|py::enum_|shared_ptr_class_|intrusive_ptr_class_|"
    r'intrusive_ptr_no_gil_destructor_class_)\s*<[^;]*?>\s*(\w*)\s*\(\s*(\w+)\s*,\s*"(\w+)"',
    re.S,
)
MEMBER = re.compile(
    r"(\w*)\s*\.(def|def_static|def_readwrite|def_readonly|def_property|"
    r"def_property_readonly|def_property_readonly_static|value|attr)"
    r'\(\s*"(\w+)"'
)
ASSIGNED = re.compile(r"(?:auto|py::object|py::module)\s+(\w+)\s*=\s*$")


def binding_names(path: str) -> List[Tuple[str, bool]]:
    """(qualified name, gpu-only) of every name the bindings define, in the order met: a
    member belongs to the variable it is called on, else to the class declared last."""
    code = _blanked(_strip_numbers(open(path, encoding="utf-8").read()))
    gpu_lines = _gpu_lines(code)
    events = [(m.start(), "class", m) for m in CLASS_DECL.finditer(code)]
    events += [(m.start(), "member", m) for m in MEMBER.finditer(code)]
    names: Dict[str, bool] = {}
    variables = {"module": "", "m": ""}
    owner = ""
    for pos, kind, m in sorted(events, key=lambda e: e[0]):
        gpu = gpu_lines[code.count("\n", 0, pos)]
        if kind == "class":
            declared_as, parent, name = m.groups()
            parent = variables.get(parent, parent)
            owner = f"{parent}.{name}" if parent else name
            assigned = ASSIGNED.search(code[max(0, pos - 80) : pos])
            if assigned:
                variables[assigned.group(1)] = owner
            if declared_as:  # py::class_<T> variable(module, "Name", ...)
                variables[declared_as] = owner
            names.setdefault(owner, gpu)
            continue
        target, member = m.group(1), m.group(3)
        if target:
            if target not in variables:
                continue
            owner = variables[target]
        if not member.startswith("__"):
            names.setdefault(f"{owner}.{member}" if owner else member, gpu)
    return sorted(names.items())


def _python_names(code: str, public_classes: bool) -> List[str]:
    """Module-level definitions of Python source, and members of its public classes."""
    names: List[str] = []
    current_class = None
    for line in code.splitlines():
        top = re.match(r"(?:def|class)\s+(\w+)|(\w+)\s*(?::[^=]*)?=(?!=)", line)
        if top:
            name = top.group(1) or top.group(2)
            current_class = name if line.startswith("class ") else None
            if name not in ("__all__",) and not name.startswith("__"):
                names.append(name)
            continue
        if line and not line[0].isspace():
            current_class = None
            continue
        if current_class and public_classes and not current_class.startswith("_"):
            member = re.match(r"    (?:def\s+(\w+)|(\w+)\s*(?::[^=]*)?=(?!=))", line)
            if member:
                name = member.group(1) or member.group(2)
                if not name.startswith("_") or name in ("_plugins", "_BackendPlugin"):
                    names.append(f"{current_class}.{name}")
    return names


def distributed_names(seeds: str) -> List[str]:
    text = open(os.path.join(seeds, DISTRIBUTED), encoding="utf-8").read()
    code = text.split("```python", 1)[1].split("\n```", 1)[0]
    names = _python_names(code, True)
    match = re.search(r"__all__ = \[(.*?)\]", code, re.S)
    names += re.findall(r'"(\w+)"', match.group(1)) if match else []
    # The older release (HTML) adds the collectives the recent listing's cut leaves out.
    html = open(os.path.join(seeds, DISTRIBUTED_OLD), encoding="utf-8").read()
    for name in re.findall(
        r'^<div class="viewcode-block" id="(\w+)">|'
        r'^<span class="k">def</span> <span class="nf">(\w+)</span>',
        html,
        re.M,
    ):
        names.append(name[0] or name[1])
    return sorted(set(names))


def functional_names(seeds: str) -> List[str]:
    code = _strip_numbers(open(os.path.join(seeds, FUNCTIONAL), encoding="utf-8").read())
    return sorted(set(n for n in _python_names(code, False) if n not in ("lib", "impl_abstract")))


# The bindings' C++ Backend is torch.distributed's _Backend (Backend there is the name class).
BINDING_ALIASES = {"Backend": "_Backend"}


def _lookup(where: List[object], dotted: str):
    """The object `dotted` names in the first of `where` that has its first part."""
    head, *rest = dotted.split(".")
    for module in where:
        if hasattr(module, head):
            obj = getattr(module, head)
            for part in rest:
                obj = getattr(obj, part)
            return obj
    raise AttributeError(dotted)


def _modules(source: str):
    import c10d
    import c10d._functional_collectives as funcol
    import c10d.distributed_c10d as dc

    if source == "bindings":
        return [c10d, c10d._C, dc]
    if source == "distributed_c10d":
        return [dc, c10d]
    return [funcol]


def resolves(source: str, name: str) -> bool:
    if source == "bindings":
        head, _, rest = name.partition(".")
        name = BINDING_ALIASES.get(head, head) + ("." + rest if rest else "")
    try:
        with warnings.catch_warnings():  # deprecated names warn when read
            warnings.simplefilter("ignore")
            _lookup(_modules(source), name)
        return True
    except AttributeError:
        return False
    except Exception:  # a property that raises on its class is still there
        return True


def gpu_explained(name: str) -> bool:
    """Whether looking `name` up on c10d raises an AttributeError that names the missing GPU
    support (for GPU-only names absent from torch's CPU builds too)."""
    import c10d

    try:
        getattr(c10d, name.split(".")[0])
    except AttributeError as e:
        return "GPU" in str(e)
    return False


def inventory(seeds: str) -> List[Tuple[str, str, str, str]]:
    """(source, name, status, note) for every seed name."""
    rows = []
    bindings = dict(binding_names(os.path.join(seeds, BINDINGS)))
    bindings.update({name: False for name in OLDER_BINDINGS})
    entries = [("bindings", n, gpu) for n, gpu in sorted(bindings.items())]
    entries += [("distributed_c10d", n, False) for n in distributed_names(seeds)]
    entries += [("_functional_collectives", n, False) for n in functional_names(seeds)]
    for source, name, gpu in entries:
        gpu = gpu or bool(GPU_WORDS.search(name))
        exists = resolves(source, name)
        if name.split(".")[0] in NOT_APPLICABLE or (
            source == "_functional_collectives" and META_KERNEL.search(name)
        ):
            status, note = "n/a", NOT_APPLICABLE.get(name.split(".")[0], "meta kernel for tracing")
        elif gpu:
            if exists:
                status, note = (
                    "gpu-only",
                    "present; using it raises, naming the missing GPU support",
                )
            elif gpu_explained(name):
                status, note = (
                    "gpu-only",
                    (
                        "absent as in torch's CPU builds; the AttributeError "
                        "names the missing GPU support"
                    ),
                )
            else:
                status, note = "missing", "GPU-only"
        elif exists and name in STUBS:
            status, note = "stub", STUBS[name]
        elif exists:
            status, note = "present", ""
        else:
            status, note = "missing", ""
        rows.append((source, name, status, note))
    return rows


def render(rows) -> str:
    counts: Dict[str, int] = {}
    for _, _, status, _ in rows:
        counts[status] = counts.get(status, 0) + 1
    order = ["present", "stub", "gpu-only", "missing", "n/a"]
    lines = [
        "# Seed names in c10d",
        "",
        "Generated by `PYTHONPATH=python python scripts/api_names.py` from the seed documents "
        "(torch's c10d bindings, `distributed_c10d.py` and `_functional_collectives.py`); "
        "do not edit by hand. `tests/python/test_api_names.py` fails when a name listed here "
        "as present, stub or gpu-only no longer resolves.",
        "",
        "Where a name is looked up: bindings names in `c10d`, then `c10d._C`, then "
        "`c10d.distributed_c10d`; `distributed_c10d` names in `c10d.distributed_c10d`, then "
        "`c10d`; functional-collective names in `c10d._functional_collectives`.",
        "",
        "| status | count |",
        "| --- | --- |",
    ]
    lines += [f"| {s} | {counts.get(s, 0)} |" for s in order]
    lines += ["", "| source | name | status | note |", "| --- | --- | --- | --- |"]
    lines += [f"| {source} | `{name}` | {status} | {note} |" for source, name, status, note in rows]
    return "\n".join(lines) + "\n"


def read_table(path: str = DOC) -> List[Tuple[str, str, str, str]]:
    """The rows of a table this script wrote."""
    rows = []
    for line in open(path, encoding="utf-8"):
        m = re.match(r"\| (\w+) \| `([\w.]+)` \| ([\w/-]+) \| (.*) \|$", line.rstrip("\n"))
        if m:
            rows.append(m.groups())
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds",
        default=os.environ.get(
            "C10D_SEEDS", os.path.join(os.path.dirname(ROOT), "shared", "seeds")
        ),
    )
    parser.add_argument(
        "--check", action="store_true", help="fail when docs/api-names.md is not up to date"
    )
    args = parser.parse_args(argv)
    text = render(inventory(args.seeds))
    if args.check:
        current = open(DOC, encoding="utf-8").read() if os.path.exists(DOC) else ""
        if current != text:
            print(f"{DOC} is out of date: run scripts/api_names.py", file=sys.stderr)
            return 1
        return 0
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(text)
    print(text.split("\n\n| source")[0].split("\n\n")[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())

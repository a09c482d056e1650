"""Module state of c10d's DistributedDataParallel: which parameters and buffers are synced
(or ignored), and their broadcasts at start-up and before each forward pass."""

from . import _C

# Start-up broadcast of the module's state: bytes per flat buffer (as torch's DDP uses).
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


class _DDPState:
    """DistributedDataParallel's parameter and buffer syncing (a base of that class)."""

    def _assign_modules_buffers(self):
        """As torch: modules_buffers and named_module_buffers are the buffers to sync (read
        again before each sync, since modules may replace their buffers)."""
        named = [(n, b) for n, b in self.module.named_buffers() if n not in self._ignored]
        self.modules_buffers = [b for _, b in named]
        self.named_module_buffers = dict(named)

    def _buffers_to_sync(self):
        self._assign_modules_buffers()
        return [b.detach() for b in self.modules_buffers]

    def _module_state(self, buffers=True):
        """Every parameter (frozen ones too, as torch syncs the whole module state) and, with
        `buffers`, buffer, but those to ignore."""
        params = [
            p.detach() for name, p in self.module.named_parameters() if name not in self._ignored
        ]
        return params + (self._buffers_to_sync() if buffers else [])

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module, params_and_buffers_to_ignore):
        """Parameters and buffers (by fully qualified name) that a DistributedDataParallel
        built on `module` afterwards neither syncs from rank 0 nor reduces, as torch's (which
        also marks them ``_ddp_ignored``)."""
        module._ddp_params_and_buffers_to_ignore = params_and_buffers_to_ignore
        for name, param in module.named_parameters():
            if name in params_and_buffers_to_ignore:
                param._ddp_ignored = True
        for name, buffer in module.named_buffers():
            if name in params_and_buffers_to_ignore:
                buffer._ddp_ignored = True

    @staticmethod
    def _get_data_parallel_params(module, named_params=False):
        """The parameters (or (name, parameter) pairs) of `module` not marked _ddp_ignored."""
        for param in module.parameters() if not named_params else module.named_parameters():
            if not hasattr(param, "_ddp_ignored"):
                yield param

    def _forward_buffers(self):
        """The buffers the forward pass broadcasts: none unless forward_sync_buffers and
        require_forward_param_sync."""
        if not (self.require_forward_param_sync and self.forward_sync_buffers):
            return []
        return self._buffers_to_sync()

    @property
    def broadcast_buffers(self):
        """torch 2.13's deprecated name of forward_sync_buffers."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value):
        self.forward_sync_buffers = value

    def will_sync_module_buffers(self):
        return len(self._forward_buffers()) > 0

    def _check_sync_bufs_pre_fwd(self):
        return self.will_sync_module_buffers()  # no buffer comm hook in c10d

    def _check_sync_bufs_post_fwd(self):
        return False

    def _sync_state(self, tensors, src=0):
        if tensors:
            _C._broadcast_coalesced(self.process_group, tensors, _BROADCAST_BUCKET_BYTES, src)

    def _distributed_broadcast_coalesced(self, tensors, buffer_size, authoritative_rank=0):
        _C._broadcast_coalesced(self.process_group, tensors, buffer_size, authoritative_rank)

    def _default_broadcast_coalesced(self, bufs=None, bucket_size=None, authoritative_rank=0):
        """Broadcasts `bufs` (default: the buffers to sync) from authoritative_rank."""
        if bufs is None:
            bufs = self._buffers_to_sync()
        if bucket_size is None:
            bucket_size = self.broadcast_bucket_size
        self._distributed_broadcast_coalesced(bufs, bucket_size, authoritative_rank)

    def _sync_module_buffers(self, authoritative_rank):
        self._default_broadcast_coalesced(authoritative_rank=authoritative_rank)

    def _sync_buffers(self, joined=False):
        """The forward pass's buffer broadcast: from rank 0, or in join mode from the highest
        rank still training (a joined rank's buffers are stale)."""
        buffers = self._forward_buffers()
        if not buffers:
            return
        src = self._find_common_rank(self._rank, not joined) if self._join_config.enable else 0
        self._sync_state(buffers, src)

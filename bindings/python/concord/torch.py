"""PyTorch integration: DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state,
broadcast_object and allgather_object.

DistributedOptimizer(opt) returns an optimizer of opt's own class (isinstance checks and learning
rate schedulers keep working) that shares opt's parameter groups and state. During backward, a
hook on each parameter's gradient accumulator enqueues that gradient's allreduce (average over
ranks, in place) as soon as the gradient is complete, so communication overlaps the rest of the
backward pass; step() waits for all of them, then runs the wrapped step. CUDA gradients take the
binding's CUDA path (the allreduce follows torch's current stream of the backward pass, and
step()'s wait makes the current stream wait; not yet run on a GPU; compression: CPU only).

concord.torch.hooks (torch_hooks.py): DDP communication hooks (allreduce_hook).
"""
import contextlib
import weakref

import torch

from ._sparse import SparseSum
from .comm import _reduce_op
from .compression import _check_compression
from .errors import InvalidArgumentError, UnavailableError


def _communicator(comm, process_set=None):
    if comm is not None and process_set is not None and comm is not process_set:
        raise ValueError("give comm or process_set, not both")
    if process_set is not None:
        return process_set
    if comm is not None:
        return comm
    import concord
    return concord.default()


# The DistributedOptimizer that reduces each parameter's gradient: id(p) -> the newest one made
# over p (a later wrap takes p over, removing the older one's hooks on p; an entry goes with its
# optimizer).
_OWNERS = weakref.WeakValueDictionary()


def _remove_hooks(by_parameter):
    """Removes the hooks whose RemovableHandles by_parameter (id(p) -> handles) holds."""
    for handles in by_parameter.values():
        for h in handles:
            h.remove()
    by_parameter.clear()


class _DistributedMixin:
    """The methods a DistributedOptimizer adds to (or overrides in) the wrapped optimizer's class.
    Not thread-safe: one training loop drives it, as with any torch optimizer. Its hooks on the
    parameters hold it weakly: an optimizer dropped (or re-wrapped over the same parameters: the
    newer one takes them over) reduces nothing more and is freed."""

    def _concord_setup(self, comm, named_parameters, compression, backward_passes_per_step, op,
                       sparse_as_dense, gradient_predivide_factor):
        if backward_passes_per_step < 1:
            raise InvalidArgumentError(1, "backward_passes_per_step must be >= 1")
        factor = float(gradient_predivide_factor)
        if not (0 < factor < float("inf")):
            raise InvalidArgumentError(
                1, "gradient_predivide_factor must be a positive finite number, not %r" %
                (gradient_predivide_factor,))
        if factor != 1.0 and _reduce_op(op) != _AVERAGE:
            raise InvalidArgumentError(
                1, "gradient_predivide_factor applies to op \"average\" only (it splits the "
                "average's division), not to op %r" % (op,))
        self._concord_predivide = factor
        self._concord = comm
        self._concord_compression = compression
        self._concord_op = op
        self._concord_sparse_as_dense = bool(sparse_as_dense)
        # id(p) -> the sparse dimensions of p's last sparse gradient with entries on this rank
        self._concord_sparse = {}
        self._concord_passes = backward_passes_per_step
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        names = {}
        if named_parameters is not None:
            names = {id(p): n for n, p in named_parameters}
            seen = set()
            for n in names.values():
                if n in seen:
                    raise InvalidArgumentError(1, "parameter name %r appears twice" % n)
                seen.add(n)
        self._concord_names = {id(p): "grad." + names.get(id(p), "param.%d" % i)
                               for i, p in enumerate(params)}
        self._concord_params = params
        self._concord_counts = {id(p): 0 for p in params}
        # id(p) -> (Handle, copy) of its gradient's allreduce in flight; copy: None, or what
        # copies the result into a gradient that is not contiguous (reduced in a copy).
        self._concord_handles = {}
        self._concord_synchronized = False  # synchronize() ran, and no backward pass since
        self._concord_skip = False  # inside skip_synchronize()
        self._concord_accumulators = []  # keep the grad accumulators (and their hooks) alive
        self._concord_hooks = {}  # id(p) -> its hooks' RemovableHandles
        weakref.finalize(self, _remove_hooks, self._concord_hooks)
        me = weakref.ref(self)
        for p in params:
            previous = _OWNERS.get(id(p))
            if previous is not None and previous is not self:
                previous._concord_release(p)
            _OWNERS[id(p)] = self
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            self._concord_hooks[id(p)] = [p.register_hook(_guard(me, p)),
                                          accumulator.register_hook(_reduce_hook(me, p))]
            self._concord_accumulators.append(accumulator)

    def _concord_release(self, p):
        """A newer DistributedOptimizer took p over: this one stops reducing its gradient."""
        _remove_hooks({0: self._concord_hooks.pop(id(p), [])})

    def _concord_before_grad(self, p):
        # Runs before the new gradient is added into p.grad: refuses while p.grad is in flight,
        # before anything is written into memory the engine is using.
        if id(p) in self._concord_handles:
            raise InvalidArgumentError(
                1, "gradient of %s computed again before step(); with gradient accumulation "
                "pass backward_passes_per_step" % self._concord_names[id(p)])
        self._concord_synchronized = False  # a new gradient: step() reduces again

    def _concord_grad_ready(self, p):
        # Runs once p.grad holds this pass's gradient.
        key = id(p)
        self._concord_counts[key] += 1
        if self._concord_counts[key] == self._concord_passes:
            self._concord_enqueue(p)

    def _concord_enqueue(self, p):
        if id(p) not in self._concord_hooks:
            raise InvalidArgumentError(
                1, "%s is reduced by a newer DistributedOptimizer made over the same parameter; "
                "step that one (this one no longer reduces it)" % self._concord_names[id(p)])
        if p.grad is None:
            # No gradient on this rank (the parameter took no part in its forward pass): zeros
            # take part instead, as Horovod's, so every rank submits the same gradients (sparse
            # ones where this rank's gradients of p came sparse before).
            p.grad = (_empty_sparse_like(p, self._concord_sparse[id(p)])
                      if id(p) in self._concord_sparse and not self._concord_sparse_as_dense else
                      torch.zeros_like(p, memory_format=torch.contiguous_format))
        grad = p.grad
        if grad.layout == torch.sparse_coo:
            if grad._nnz() > 0:
                self._concord_sparse[id(p)] = grad.sparse_dim()
            elif grad.sparse_dim() != self._concord_sparse.get(id(p), 1):
                # An empty one in the layout of the others' (zero_grad() leaves torch 1.13's
                # with every dimension sparse).
                grad = p.grad = _empty_sparse_like(p, self._concord_sparse.get(id(p), 1))
            if not self._concord_sparse_as_dense:
                self._concord_handles[id(p)] = self._concord_allgather_sparse(p, grad)
                return
            grad = p.grad = grad.to_dense()
        if grad.layout != torch.strided:
            raise InvalidArgumentError(
                1, "the gradient %s is a %s tensor: DistributedOptimizer reduces dense and "
                "sparse COO gradients" % (self._concord_names[id(p)], grad.layout))
        target, copy = grad, None
        if not grad.is_contiguous():
            # A channels_last or transposed parameter's gradient has its layout: reduced in a
            # contiguous copy, copied back once done.
            target = grad.contiguous()
            copy = grad.copy_
        op, prescale, postscale = self._concord_op, 1.0 / self._concord_passes, 1.0
        if self._concord_predivide != 1.0:  # an average, split around the sum (Horovod's)
            op = "sum"
            prescale /= self._concord_predivide
            postscale = self._concord_predivide / self._concord.size
        self._concord_handles[id(p)] = (self._concord.allreduce_async(
            target, out=target, name=self._concord_names[id(p)], op=op, prescale=prescale,
            postscale=postscale, compression=self._concord_compression),
            copy and (lambda: copy(target)))

    def _concord_allgather_sparse(self, p, grad):
        """Horovod's sparse path: every rank's (index, value) pairs of p's gradient allgathered
        (_sparse.SparseSum), their values scaled (1/ranks for an average, 1/passes), as one
        sparse gradient (uncoalesced: torch's sparse optimizers and addition take it as it is).
        Returns the (waitable, finish) pair _concord_handles keeps."""
        op = _reduce_op(self._concord_op)
        name = self._concord_names[id(p)]
        if op not in (_SUM, _AVERAGE):
            raise InvalidArgumentError(
                1, "the gradient %s is sparse: sparse gradients are allgathered, so they are "
                "summed or averaged only, not reduced by op %r (pass sparse_as_dense=True)"
                % (name, self._concord_op))
        part = SparseSum(grad, "the sparse gradient " + name)
        indices = self._concord.allgather_async(part.index_rows, name=name + ".indices")
        values = self._concord.allgather_async(part.value_rows, name=name + ".values")
        scale = 1.0 / self._concord_passes
        if op == _AVERAGE:
            scale /= self._concord.size

        def finish():
            p.grad = part.sum(indices.wait(), values.wait()) * scale

        return _Both(indices, values), finish

    def synchronize(self):
        """Enqueues the gradients whose hooks have not fired yet (e.g. fewer backward passes than
        backward_passes_per_step), in parameter order, waits for every allreduce, and ends the
        step (Communicator.end_step). A parameter without a gradient on this rank (unused in its
        forward pass, as a branch other ranks took) gets zeros, reduced with the others' (as
        Horovod's), so that every rank submits every gradient. A step() that follows (with no
        backward pass between) does not reduce the gradients again, so they can be read or
        clipped in between, as with Horovod's synchronize() and skip_synchronize()."""
        self._concord_synchronize()
        self._concord_synchronized = True

    def _concord_synchronize(self):
        for p in self._concord_params:
            if id(p) not in self._concord_handles:
                self._concord_enqueue(p)
        handles, self._concord_handles = self._concord_handles, {}
        try:
            for h, copy in handles.values():
                h.wait()
                if copy is not None:
                    copy()
        finally:
            for key in self._concord_counts:
                self._concord_counts[key] = 0
        # Every rank ends its step here, so a rank that skipped a gradient this step fails with a
        # mismatch instead of reducing its next step's gradient with this one's.
        self._concord.end_step()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """`with opt.skip_synchronize(): opt.step()` steps without reducing (Horovod's): after an
        explicit synchronize(), or to step on this rank's own gradients. Refused while
        allreduces are in flight (they are still writing into the gradients)."""
        self._concord_skip = True
        try:
            yield
        finally:
            self._concord_skip = False

    def step(self, closure=None):
        """Waits for the gradients' allreduces, then runs the wrapped optimizer's step; after
        synchronize() (and no backward pass since) or inside skip_synchronize(), only the
        latter."""
        if self._concord_skip:
            if self._concord_handles:
                raise InvalidArgumentError(
                    1, "step() inside skip_synchronize() while gradient allreduces are in "
                    "flight; call synchronize() first")
        elif not self._concord_synchronized:
            self._concord_synchronize()
        self._concord_synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        """The wrapped zero_grad (with its own defaults), which also restarts the count of
        backward passes toward backward_passes_per_step (the gradients accumulated so far are
        gone); refused while allreduces are in flight, because the engine is still writing into
        the gradients."""
        if self._concord_handles:
            raise InvalidArgumentError(
                1, "zero_grad() while gradient allreduces are in flight; call step() or "
                "synchronize() first")
        for key in self._concord_counts:
            self._concord_counts[key] = 0
        self._concord_synchronized = False
        return super().zero_grad(*args, **kwargs)


_SUM, _AVERAGE = 0, 1  # concord_reduce_op_t


class _Both:
    """Waits for two handles (a sparse gradient's indices and values)."""

    def __init__(self, first, second):
        self._handles = (first, second)

    def wait(self):
        for h in self._handles:
            h.wait()


def _empty_sparse_like(p, sparse_dim):
    """A sparse gradient of p with no entries and `sparse_dim` sparse dimensions."""
    return torch.sparse_coo_tensor(torch.empty((sparse_dim, 0), dtype=torch.int64),
                                   torch.empty((0,) + tuple(p.shape[sparse_dim:]), dtype=p.dtype),
                                   p.shape)


def _guard(optimizer, p):
    """p's tensor hook (optimizer: a weak reference)."""
    def guard(grad):
        opt = optimizer()
        if opt is not None:
            opt._concord_before_grad(p)
        return grad

    return guard


def _reduce_hook(optimizer, p):
    """p's gradient accumulator's hook (optimizer: a weak reference)."""
    def hook(*_):
        opt = optimizer()
        if opt is not None:
            opt._concord_grad_ready(p)

    return hook


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op="average", comm=None, process_set=None,
                         sparse_as_dense=False, gradient_predivide_factor=1.0):
    """Wraps a torch optimizer for data-parallel training over Concord.

    named_parameters: model.named_parameters(), to name each gradient (the names must be the same
    on every rank; without them parameters are named by their position). compression: a spec such
    as "fp16", "bf16" or "topk:density=0.01" for every gradient of this optimizer (None: the
    communicator's default, CONCORD_COMPRESSION); the library checks it at the first allreduce,
    inside backward(), and a spec it cannot parse raises InvalidArgumentError there (a library
    too old to take compression refuses any spec at construction, with UnavailableError).
    backward_passes_per_step: gradients are accumulated locally over
    this many backward passes before one allreduce; the result is the average over ranks and
    passes. comm: a Communicator (default: the one concord.init() made); process_set: a
    sub-communicator (Communicator.split or create_group), as Horovod's process sets: gradients
    are averaged over its ranks only (the same as comm=). Sparse gradients (an Embedding with
    sparse=True) are allgathered, as Horovod's: every rank's (index, value) pairs, scaled, make
    one sparse gradient (op "average" or "sum" only; no compression); sparse_as_dense=True turns
    them dense and allreduces them instead. gradient_predivide_factor f (op "average" only, as
    Horovod's): each gradient is divided by f before the sum and the sum by ranks / f after it,
    to keep half-precision sums in range (dense gradients; the result is the same average)."""
    comm = _communicator(comm, process_set)
    _check_compression(compression)  # an old library: fail at construction, not in backward
    cls = type(optimizer.__class__.__name__, (_DistributedMixin, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)  # the same param_groups, state and defaults
    wrapped._concord_setup(comm, named_parameters, compression, backward_passes_per_step, op,
                           sparse_as_dense, gradient_predivide_factor)
    return wrapped


def broadcast_parameters(params, root_rank=0, comm=None, process_set=None):
    """Overwrites every rank's parameters (or buffers) with root_rank's, in place. params: a
    state_dict, an iterable of (name, tensor) such as model.named_parameters(), or of tensors
    (model.parameters(): named by position). root_rank is a rank of comm (or of process_set)."""
    comm = _communicator(comm, process_set)
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    handles = []
    with torch.no_grad(), comm.group():
        for i, item in enumerate(items):
            # A bare tensor (model.parameters()) is named by its position, as Horovod's.
            name, tensor = (str(i), item) if isinstance(item, torch.Tensor) else item
            if not isinstance(tensor, torch.Tensor):
                raise InvalidArgumentError(
                    1, "broadcast_parameters: %r is a %s, not a tensor (params: a state_dict, "
                    "named_parameters() or tensors)" % (name, type(tensor).__name__))
            t = tensor.detach()
            # A channels_last or transposed tensor: broadcast through a contiguous copy.
            target = t if t.is_contiguous() else t.contiguous()
            handles.append((comm.broadcast_async(target, root=root_rank, out=target,
                                                 name="param." + name), t, target))
    for h, t, target in handles:
        h.wait()
        if target is not t:
            with torch.no_grad():
                t.copy_(target)


def broadcast_optimizer_state(optimizer, root_rank=0, comm=None, process_set=None):
    """Loads root_rank's optimizer state (its state_dict: moments, steps, learning rates) into
    every rank's optimizer."""
    comm = _communicator(comm, process_set)
    state = comm.broadcast_object(optimizer.state_dict() if comm.rank == root_rank else None,
                                  root=root_rank, name="optimizer_state")
    if comm.rank != root_rank:
        optimizer.load_state_dict(state)


def broadcast_object(obj, root_rank=0, comm=None, process_set=None, name=None):
    """root_rank's obj on every rank (pickled; Horovod's hvd.broadcast_object): see
    Communicator.broadcast_object."""
    return _communicator(comm, process_set).broadcast_object(obj, root=root_rank, name=name)


def allgather_object(obj, comm=None, process_set=None, name=None):
    """Every rank's obj, in rank order (Horovod's hvd.allgather_object): see
    Communicator.allgather_object."""
    return _communicator(comm, process_set).allgather_object(obj, name=name)


# `import concord.torch` registers the torch.distributed backend "concord" (torch_backend.py); a
# torch too old for it keeps DistributedOptimizer and says why at import.
def _register_backend():
    from . import torch_backend
    try:
        torch_backend.register()
    except UnavailableError as e:
        import warnings
        warnings.warn(str(e))


_register_backend()
from . import torch_hooks as hooks  # noqa: E402  (concord.torch.hooks: DDP communication hooks)

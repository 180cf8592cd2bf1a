"""Sparse COO tensors summed over ranks through two allgathers, as gloo sums them (torch's
all_reduce of a sparse tensor, DDP's gradients of an Embedding with sparse=True): each rank's
coalesced entries as index rows (int64, one column per sparse dimension) and value rows (the
tensor's dtype and dense dimensions), their counts differing between ranks. The index rows start
with two header rows, the rank's sizes of the sparse dimensions and its entry count, so that
every rank finds each rank's block and checks that all the tensors have the same shape; Concord
checks the dtype and the dense dimensions (the values' rows). Used by concord.torch's
DistributedOptimizer, the torch backend and the DDP hook."""
import torch

from .errors import InvalidArgumentError, Status


class SparseSum:
    """One sparse tensor's part in a sum over ranks: submit `index_rows` and `value_rows` (CPU,
    contiguous) to two allgathers, then sum(index_all, value_all) gives every rank's entries
    as one sparse tensor (uncoalesced: duplicates add up when it is coalesced or used)."""

    def __init__(self, t, what):
        if t.is_cuda:
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "%s: a sparse CUDA tensor; Concord sums sparse CPU "
                "tensors only" % what)
        c = t.coalesce()
        self._what = what
        self._shape = tuple(c.shape)
        self._sparse_dim = c.sparse_dim()
        header = torch.zeros((2, self._sparse_dim), dtype=torch.int64)
        header[0] = torch.tensor(self._shape[:self._sparse_dim], dtype=torch.int64)
        header[1, 0] = c._nnz()
        self.index_rows = torch.cat([header, c.indices().t()]).contiguous()
        self.value_rows = c.values().contiguous()

    def sum(self, index_all, value_all):
        """The sparse tensor of every rank's entries (the allgathers' results, in rank order);
        InvalidArgumentError, the same on every rank, when a rank's shape differs."""
        blocks, at, rank = [], 0, 0
        while at < index_all.shape[0]:
            count = int(index_all[at + 1, 0]) if at + 1 < index_all.shape[0] else -1
            if count < 0 or at + 2 + count > index_all.shape[0]:
                raise InvalidArgumentError(
                    Status.ERR_INVALID_ARGUMENT, "%s: rank %d's index rows are malformed (not "
                    "a sparse tensor's)" % (self._what, rank))
            sizes = tuple(index_all[at].tolist())
            if sizes != self._shape[:self._sparse_dim]:
                raise InvalidArgumentError(
                    Status.ERR_INVALID_ARGUMENT, "%s: rank %d's sparse tensor has the sizes %s "
                    "in its sparse dimensions, not %s as this rank's" %
                    (self._what, rank, list(sizes), list(self._shape[:self._sparse_dim])))
            blocks.append(index_all[at + 2:at + 2 + count])
            at += 2 + count
            rank += 1
        indices = torch.cat(blocks).t()
        if indices.shape[1] != value_all.shape[0]:
            raise InvalidArgumentError(
                Status.ERR_INVALID_ARGUMENT, "%s: the ranks sent %d indices and %d values" %
                (self._what, indices.shape[1], value_all.shape[0]))
        return torch.sparse_coo_tensor(indices, value_all, self._shape)

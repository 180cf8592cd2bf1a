"""Test helpers: a torch tensor that says it is on cuda:0, to show the binding's decisions for CUDA
tensors without a GPU, and a DDP bucket stand-in to hand a hook. Its memory is host memory: only hand it to a communicator without a GPU
backend (CONCORD_BACKEND gloo), which refuses a CUDA tensor before touching its memory."""
import os


def no_gpu_backend():
    """Whether this process's communicators start without a GPU backend (CONCORD_BACKEND)."""
    return os.environ.get("CONCORD_BACKEND", "gloo") in ("gloo", "gloo-ibverbs")


def fake_cuda_tensor(torch, values):
    """`values` (a CPU tensor) as a tensor whose device is cuda:0 and is_cuda True."""
    class FakeCuda(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda", 0)

        @property
        def is_cuda(self):
            return True

    return torch.Tensor._make_subclass(FakeCuda, values)


class FakeBucket:
    """A DDP GradBucket stand-in of one tensor, for calling a communication hook directly."""

    def __init__(self, tensor):
        self.tensor = tensor

    def index(self):
        return 0

    def buffer(self):
        return self.tensor

    def parameters(self):
        return [self.tensor]

"""An unmodified DDP script (examples/python/ddp_train.py) trained on "concord" ends with the
parameters it ends with on "gloo", to 1e-5: its small CNN and torchvision's resnet18 at 2 ranks
under concordrun (its torchrun-style variables give env:// its rendezvous), and resnet18 under
torch 2.x's torchrun when a torch 2.x virtual environment is there (python_torch2_venv makes it;
python_torch2_backend_np2 runs a CNN's DDP under that torchrun, in test_torch_backend.py).
About 30 s.
Exits 77 when this Python lacks torch or torchvision.

    ddp_script_test.py PYTHON CONCORDRUN [TORCH2_VERSION]

The torch 2.x environment is found where torch2_test.sh makes it: $CONCORD_CACHE_DIR, else
$XDG_CACHE_HOME/concord, else ~/.cache/concord, in torch-VERSION-pyX.Y (X.Y: PYTHON's).
"""
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "examples", "python", "ddp_train.py")
STEPS = 3


def run(argv, env=None):
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=180, env=env)
    if result.returncode != 0:
        sys.exit("FAIL: %s exited %d:\n%s" % (" ".join(argv), result.returncode, result.stdout))
    return result.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(launch, backend, model, out, env=None):
    path = os.path.join(out, "%s-%s-%s.pt" % (launch[0].split("/")[-1], backend, model))
    run(launch + [SCRIPT, "--backend", backend, "--model", model, "--steps", str(STEPS), "--save",
                  path], env)
    return path


def compare(python, a, b, what, env=None):
    """Loads two saved state_dicts with `python` (the torch that wrote them) and compares."""
    code = ("import sys, torch\n"
            "a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])\n"
            "assert a.keys() == b.keys(), 'different parameters'\n"
            "worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a)\n"
            "print('%d tensors, largest difference %.3g' % (len(a), worst))\n"
            "sys.exit(0 if worst <= 1e-5 else 1)\n")
    result = subprocess.run([python, "-c", code, a, b], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=120, env=env)
    print("%s: %s" % (what, result.stdout.strip()), flush=True)
    if result.returncode != 0:
        sys.exit("FAIL: %s: concord and gloo differ by more than 1e-5" % what)


def torch2_python(python, version):
    """The torch `version` environment's Python, or None when it is not (completely) made."""
    cache = os.environ.get("CONCORD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "concord")
    pyver = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True).stdout.strip()
    venv = os.path.join(cache, "torch-%s-py%s" % (version, pyver))
    # torch2_test.sh's mark of a finished install (with torchvision).
    return os.path.join(venv, "bin", "python") if os.path.exists(venv + "/.ready.2") else None


def main():
    python, concordrun = sys.argv[1], sys.argv[2]
    version = sys.argv[3] if len(sys.argv) > 3 else None
    probe = subprocess.run([python, "-c", "import torch, torchvision"], capture_output=True)
    if probe.returncode != 0:
        print("SKIPPED: %s lacks torch or torchvision (apt-get install python3-torch "
              "python3-torchvision; scripts/setup.sh installs them)" % python)
        sys.exit(77)
    with tempfile.TemporaryDirectory() as out:
        launch = [concordrun, "-np", "2", "--no-summary", python]
        for model in ("cnn", "resnet18"):
            gloo = train(launch, "gloo", model, out)
            ours = train(launch, "concord", model, out)
            compare(python, gloo, ours, "concordrun, %s, %d steps" % (model, STEPS))
        torch2 = torch2_python(python, version) if version else None
        if not torch2:
            print("torchrun: no torch %s environment (python_torch2_venv makes it): not "
                  "run" % version)
            return
        torchrun = os.path.join(os.path.dirname(torch2), "torchrun")
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        for k in [k for k in env if k.startswith("CONCORD_")]:
            del env[k]
        env["CONCORD_LIBRARY"] = os.environ["CONCORD_LIBRARY"]
        # torch's modules compiled once into the environment's cache (torch2_test.sh does the
        # same), not on every import: 2 s instead of 3.2 s a process.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(os.path.dirname(os.path.dirname(torch2)),
                                                  "pycache")
        paths = {}
        for backend in ("gloo", "concord"):
            launch = [torchrun, "--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
                      "127.0.0.1", "--master-port", str(free_port())]
            paths[backend] = train(launch, backend, "resnet18", out, env)
        compare(torch2, paths["gloo"], paths["concord"], "torchrun (torch 2.x), resnet18, %d steps"
                % STEPS, env)


if __name__ == "__main__":
    main()

"""Builds the pure-Python package. When a built libconcord is found ($CONCORD_LIBRARY, else the
repository's build/ or build-*/ directories), a copy goes into the package, so `import concord`
finds it wherever the package is installed; without one, the package looks for it at import time
($CONCORD_LIBRARY, then the system loader)."""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def find_library():
    if os.environ.get("CONCORD_LIBRARY"):
        return os.environ["CONCORD_LIBRARY"]
    for build in [os.path.join(ROOT, "build")] + sorted(glob.glob(os.path.join(ROOT, "build-*"))):
        path = os.path.join(build, "libconcord.so")
        if os.path.exists(path):
            return path
    return None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        library = find_library()
        if library is None:
            print("concord: no built libconcord found; the package will look for it at import "
                  "time ($CONCORD_LIBRARY, then the system loader)")
            return
        target = os.path.join(self.build_lib, "concord", "libconcord.so")
        shutil.copyfile(os.path.realpath(library), target)
        print("concord: bundled %s" % library)


setup(cmdclass={"build_py": BuildPyWithLibrary})

"""The one build step pyproject.toml cannot declare: the engine recipe (images/) goes
into the package as k3infra/engine/recipe/, so an installed k3infra builds the engine
(`k3:engine.build: local`, in-cluster with a configmap context) without a checkout.
images/ stays where it is: the git build context (`<repo>#<rev>:images`) and the
Dockerfile tests read it there. An editable install reads the checkout's images/
directly (k3infra.engine.component.find_recipe_dir)."""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# k3infra.engine.component.RECIPE_FILES (tests/test_packaging.py keeps them equal; the
# package cannot be imported here, its dependencies are not in the build environment).
# The locks are compiled per engine commit and packaged only when present.
RECIPE_FILES = ("Dockerfile", "k3_engine_build.py", "build.lock", "runtime.lock")
IMAGES = Path(__file__).resolve().parent / "images"


class BuildPyWithRecipe(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "k3infra" / "engine" / "recipe"
        self.mkpath(str(target))
        for name in RECIPE_FILES:
            if (IMAGES / name).is_file():
                self.copy_file(str(IMAGES / name), str(target / name))


setup(cmdclass={"build_py": BuildPyWithRecipe})

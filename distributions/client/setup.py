"""kiln-client's wheel: of the `kiln` package (platform/kiln, linked here), only the modules [tool.kiln] names."""
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CLIENT_MODULES = set(tomllib.loads((Path(__file__).parent / "pyproject.toml").read_text())["tool"]["kiln"]["client-modules"])


class ClientModulesOnly(build_py):
    def find_package_modules(self, package, package_dir):
        return [found for found in super().find_package_modules(package, package_dir) if package != "kiln" or found[1] in CLIENT_MODULES]


setup(cmdclass={"build_py": ClientModulesOnly})

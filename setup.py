"""kiln-server's wheel: everything pyproject.toml names, less the `kiln` modules that ship in kiln-client
(distributions/client/pyproject.toml [tool.kiln]); the two wheels together make the whole `kiln` package."""
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CLIENT = Path(__file__).parent / "distributions" / "client" / "pyproject.toml"
CLIENT_MODULES = set(tomllib.loads(CLIENT.read_text())["tool"]["kiln"]["client-modules"])


class WithoutClientModules(build_py):
    def find_package_modules(self, package, package_dir):
        return [found for found in super().find_package_modules(package, package_dir) if package != "kiln" or found[1] not in CLIENT_MODULES]


setup(cmdclass={"build_py": WithoutClientModules})

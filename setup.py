"""Thin shim: metadata lives in pyproject.toml.

The only thing declared here is the package list, because the shipped patch sets live in the
top-level ``patches/`` folder (data only) and are installed as the ``porter.patchsets`` package.
"""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["porter", "porter.*", "ops_prebuild", "ops_prebuild.*"]),
                "porter.patchsets"])

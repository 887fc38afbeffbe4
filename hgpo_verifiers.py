"""The verifiers plugin id ``hgpo-verifiers``: verifiers imports a taskset by an undotted module
name, so this module re-exports :mod:`integrations.verifiers` under one."""

from integrations.verifiers import *
from integrations.verifiers import __all__  # noqa: F401

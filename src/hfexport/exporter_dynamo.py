"""Spec import path: ``hfexport.exporter_dynamo`` (DynamoExporter, DynamoConfig, register_pytree_node)."""

from .backends.dynamo.exporter import DynamoExporter
from .configs import DynamoConfig
from .pytrees import register_pytree_node

__all__ = ["DynamoExporter", "DynamoConfig", "register_pytree_node"]

"""Spec import path: ``hfexport.exporter_dynamo`` (DynamoExporter, DynamoConfig, register_pytree_node)."""

from .backends.dynamo.exporter import DynamoExporter
from .capture.caches import register_pytree_node
from .configs import DynamoConfig

__all__ = ["DynamoExporter", "DynamoConfig", "register_pytree_node"]

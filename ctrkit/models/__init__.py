"""Models: building blocks, the registry, and one file per architecture family."""

from ctrkit.models.dcnv2 import DCNv2, DCNv2Config
from ctrkit.models.dlrm import DLRM, DLRMConfig
from ctrkit.models.registry import create_model, list_models, register_model
from ctrkit.models.wide_deep import WideDeep, WideDeepConfig

__all__ = [
    "DCNv2",
    "DCNv2Config",
    "DLRM",
    "DLRMConfig",
    "create_model",
    "list_models",
    "register_model",
    "WideDeep",
    "WideDeepConfig",
]

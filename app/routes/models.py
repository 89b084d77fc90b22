"""Which base models this server offers."""

from __future__ import annotations

from fastapi import APIRouter

from extension.plan.models import BUILTIN_MODELS, available_local_models

from ..deps import KeyDep, SettingsDep
from ..schemas import ModelInfo, ModelList
from . import AUTH_ERRORS

router = APIRouter(tags=["models"], responses=AUTH_ERRORS)


@router.get("/models", response_model=ModelList, summary="Base models accepted as base_model")
def list_models(_key: KeyDep, settings: SettingsDep) -> ModelList:
    data = [ModelInfo(name=m.name, kind="builtin", description=m.description) for m in BUILTIN_MODELS.values()]
    data += [ModelInfo(name=name, kind="models_dir", description=None) for name in available_local_models(settings.model_sources())]
    return ModelList(data=data)

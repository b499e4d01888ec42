"""A local model folder as transformers reads it: its `config.json` (no code of its own), its model
built and its weights loaded by transformers' own `from_pretrained` (its key conversion), and configs
built from fields, each field checked, so a misspelt one is refused rather than kept."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.errors import ConfigError, first_line


def type_config_class(model_type: str) -> Any:
    """The `transformers` config class of `model_type`."""
    import transformers

    return transformers.CONFIG_MAPPING[model_type]


def folder_config(folder: str, architecture: str | None, fields: dict[str, Any]) -> Any:
    """The `transformers` config a model folder's `config.json` gives, `fields` set on it. Read from
    the local file only; a config that names code of its own (`auto_map`) is refused.

    Raises:
        ConfigError: the config names code, an architecture transformers does not have or other
            than `architecture`, or a field it does not have.
    """
    import json
    from pathlib import Path

    import transformers

    from pipeline.files import read_regular

    path = Path(folder) / "config.json"
    try:
        raw = json.loads(read_regular(path, "the model folder's config.json", 1 << 26))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not a JSON config ({exc}); save the model with save_pretrained") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} is not a JSON object; save the model with save_pretrained")
    if raw.get("auto_map"):
        raise ConfigError(f"{path} names code of its own (auto_map: {sorted(raw['auto_map'])}); no code from a model folder "
                          "runs here (trust_remote_code is refused): use a model type transformers has")
    kind = raw.get("model_type")
    if architecture is not None and architecture != kind:
        raise ConfigError(f"model.kwargs.architecture = {architecture!r}, but {path} is a {kind!r} model; drop "
                          "model.kwargs.architecture (the folder names it)")
    if kind not in transformers.CONFIG_MAPPING:
        raise ConfigError(f"{path} names model_type {kind!r}, which transformers {transformers.__version__} does not have; "
                          "save the model with a transformers that does, or upgrade transformers")
    cfg = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    return _set_fields(cfg, fields)


def _set_fields(cfg: Any, fields: dict[str, Any]) -> Any:
    """`cfg` with `fields` set on it, each one it has (`check_fields`)."""
    check_fields(type(cfg), cfg.to_dict(), fields)
    for name, value in fields.items():
        setattr(cfg, name, value)
    return cfg


def tower_config(cfg: Any, tower: str | None, fields: dict[str, Any], where: str) -> Any:
    """`cfg` itself, or where it is a model of several towers (its sub-configs: SigLIP's and CLIP's
    `text_config` and `vision_config`), the config of the one `tower` names; `fields` set on the one chosen.

    Raises:
        ConfigError: a model of towers and none named, a tower it does not have, or a tower named for a
            model of one.
    """
    towers = sorted(name.removesuffix("_config") for name in getattr(cfg, "sub_configs", {}) or {})
    if tower is None:
        if towers:
            raise ConfigError(f"{where} is a {type(cfg).__name__} of towers {towers}; an encoder program is one of "
                              f"them: set model.kwargs.tower (e.g. model.kwargs.tower={towers[-1]})")
        return _set_fields(cfg, fields)
    if tower not in towers:
        raise ConfigError(f"model.kwargs.tower = {tower!r}: {where} is a {type(cfg).__name__}"
                          + (f" of towers {towers}" if towers else ", one model: drop model.kwargs.tower"))
    return _set_fields(getattr(cfg, f"{tower}_config"), fields)


def encoder_class(cfg: Any) -> Any:
    """What an encoder program builds from a folder of `cfg`: the encoder class the folder was saved from
    where its `config.json` names one (`architectures`: T5EncoderModel, WhisperEncoder; transformers'
    own), else transformers' base model (`AutoModel`)."""
    import importlib

    import transformers

    for name in getattr(cfg, "architectures", None) or []:
        if "Encoder" not in name or "EncoderDecoder" in name:
            continue
        found = getattr(transformers, name, None)
        if found is None:
            try:  # a class transformers keeps in its model's module only (WhisperEncoder)
                found = getattr(importlib.import_module(f"transformers.models.{cfg.model_type}.modeling_{cfg.model_type}"),
                                name, None)
            except ImportError:
                continue
        if isinstance(found, type) and issubclass(found, transformers.PreTrainedModel):
            return found
    return transformers.AutoModel


def encoder_part(model: Any, loaded: dict[str, list[str]]) -> tuple[Any, dict[str, list[str]]]:
    """The encoder of an encoder-decoder `model` (itself for any other), and of what its loading left
    (`from_folder`) the keys that are the encoder's: the parts that share no weight with it (the
    decoder) are not the program's."""
    if not isinstance(getattr(model, "decoder", None), torch.nn.Module) or not hasattr(model, "get_encoder"):
        return model, loaded
    encoder = model.get_encoder()
    mine = {id(p) for p in encoder.parameters()}
    other = {name for name, child in model.named_children() if not any(id(p) in mine for p in child.parameters())}
    return encoder, {kind: [k for k in keys if k.split(".")[0] not in other] for kind, keys in loaded.items()}


def from_folder(model_class: Any, cfg: Any, folder: str, dtype: torch.dtype | None = None) -> tuple[Any, dict[str, list[str]]]:
    """The model of a folder as transformers loads it (`from_pretrained`, its weights' keys mapped by
    transformers' own conversion, as for the names ViT-family checkpoints keep), built from `cfg`;
    and the keys it did not set, could not place, or found of another shape (`objects.model` holds
    them to `model.weights_partial`).

    Raises:
        ConfigError: transformers has no such model for the config, or cannot read the folder's weights.
    """
    from safetensors import SafetensorError

    try:
        model, info = model_class.from_pretrained(folder, config=cfg, local_files_only=True, trust_remote_code=False,
                                                  output_loading_info=True, attn_implementation=cfg._attn_implementation,
                                                  **({"dtype": dtype} if dtype is not None else {}))
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
        raise ConfigError(f"model folder {folder!r}: transformers has no {model_class.__name__} for a {type(cfg).__name__} "
                          f"({first_line(exc)}); build it with the other factory (pipeline.models.hf.encoder or .decoder)") from exc
    except SafetensorError as exc:
        raise ConfigError(f"model folder {folder!r}: a weight file is not safetensors (truncated or another format: "
                          f"{first_line(exc)}); copy the folder again or save it with save_pretrained") from exc
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"model folder {folder!r}: transformers cannot load its weights into a {type(cfg).__name__}'s "
                          f"model ({first_line(exc)}); check the folder's files and model.kwargs") from exc
    return model, {k: sorted(map(str, info.get(k) or ())) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}


def config_with(config_class: Any, fields: dict[str, Any]) -> Any:
    """The `transformers` config with `fields` set. `transformers` keeps any keyword as an attribute,
    so a misspelt field would silently build the default-sized model: unknown fields are refused.

    Raises:
        ConfigError: a field the config class does not have.
    """
    check_fields(config_class, config_class().to_dict(), fields)
    return config_class(**fields)


def check_fields(config_class: Any, known: dict[str, Any], fields: dict[str, Any]) -> None:
    """Refuse a field neither the config nor its aliases (`attribute_map`: GPT-2's `hidden_size`
    is its `n_embd`) have."""
    import difflib

    names = [*known, *getattr(config_class, "attribute_map", {})]
    for name in sorted(set(fields) - set(names)):
        close = difflib.get_close_matches(name, names, n=1)
        raise ConfigError(f"model.kwargs.{name} is not a field of {config_class.__name__}"
                          + (f" (did you mean {close[0]!r}?)" if close else ""))

"""Hugging Face `transformers` models: encoders, and causal decoders with a static KV cache. Built
from an architecture name and config fields (seeded random weights; nothing is downloaded), or from a
local model folder (`model.weights=<folder>`: its `config.json` says what to build, its weights load
as transformers loads them, `from_folder`, held to `pipeline.config.objects`' rules, a decoder carries
its `tokenizer.json`); no code from a folder runs (`trust_remote_code` is refused)."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from pipeline import dtypes
from pipeline.errors import ConfigError, first_line
from pipeline.models.hf_folder import (
    config_with,
    encoder_class,
    encoder_part,
    folder_config,
    from_folder,
    tower_config,
    type_config_class,
)
from pipeline.models.registry import model_factory

# architecture -> (model class, config class, what forward takes)
ENCODERS = {
    "bert": ("BertModel", "BertConfig", "tokens"),
    "roberta": ("RobertaModel", "RobertaConfig", "tokens"),
    "distilbert": ("DistilBertModel", "DistilBertConfig", "tokens"),
    "electra": ("ElectraModel", "ElectraConfig", "tokens"),
    "albert": ("AlbertModel", "AlbertConfig", "tokens"),
    "mpnet": ("MPNetModel", "MPNetConfig", "tokens"),
    "clip_text": ("CLIPTextModel", "CLIPTextConfig", "tokens"),
    "t5_encoder": ("T5EncoderModel", "T5Config", "tokens"),
    "vit": ("ViTModel", "ViTConfig", "pixels"),
    "deit": ("DeiTModel", "DeiTConfig", "pixels"),
    "beit": ("BeitModel", "BeitConfig", "pixels"),
    "dinov2": ("Dinov2Model", "Dinov2Config", "pixels"),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", "pixels"),
    "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig", "pixels"),
    "convnext": ("ConvNextModel", "ConvNextConfig", "pixels"),
    "swin": ("SwinModel", "SwinConfig", "pixels"),
    "whisper_encoder": ("WhisperModel", "WhisperConfig", "features"),
}


class Encoder(torch.nn.Module):
    """A `transformers` encoder whose forward takes one tensor and returns its last hidden state."""

    folder_loading: dict[str, list[str]] | None = None  # from a model folder: what transformers' loading left (from_folder)

    def __init__(self, model: torch.nn.Module, takes: str) -> None:
        super().__init__()
        self.model = model
        self.takes = takes

    @property
    def checkpoint_module(self) -> torch.nn.Module:
        """What a checkpoint of this model holds: the `transformers` model's state dict."""
        return self.model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.takes == "features":
            return self.model(x).last_hidden_state
        key = "input_ids" if self.takes == "tokens" else "pixel_values"
        return self.model(**{key: x}).last_hidden_state


# A model's main input -> what `Encoder.forward` takes.
_TAKES = {"input_ids": "tokens", "pixel_values": "pixels", "input_features": "features"}


@model_factory
def encoder(architecture: str | None = None, *, folder: str | None = None, tower: str | None = None,
            **config: Any) -> torch.nn.Module:
    """The encoder of `architecture` (a key of `ENCODERS`), its config's defaults overridden by
    `config`; or, from a model `folder`, the base model its `config.json` names, fields overridden
    by `config`, its weights loaded as transformers loads them (`from_folder`). A folder of a model
    of several towers (SigLIP, CLIP: text and vision) builds the one `tower` names, from the
    folder's weights of that tower.

    Raises:
        ConfigError: an unknown architecture, or a folder whose model transformers cannot build.
    """
    import transformers

    if folder is not None:
        cfg = tower_config(folder_config(folder, architecture, {}), tower, config, f"model folder {folder!r}")
        cfg._attn_implementation = "eager"
        model, loaded = from_folder(encoder_class(cfg), cfg, folder)
        takes = _TAKES.get(model.main_input_name)
        model, loaded = encoder_part(model, loaded)
        if tower:  # the other towers' weights (and the pair's own, e.g. SigLIP's logit scale) are not this model's
            own = {key.split(".")[0] for key in model.state_dict()}
            loaded["unexpected_keys"] = [k for k in loaded["unexpected_keys"] if k.split(".")[0] in own]
        if takes is None:
            raise ConfigError(f"model folder {folder!r}: a {type(model).__name__} takes {model.main_input_name!r}; an "
                              f"encoder program takes one of {sorted(_TAKES)}")
        built = Encoder(model.eval(), takes)
        built.folder_loading = loaded
        return built
    if tower is not None:
        raise ConfigError(f"model.kwargs.tower = {tower!r} picks a tower of a model folder; set model.weights=<folder> "
                          "or drop model.kwargs.tower")
    if architecture is None:
        raise ConfigError("pipeline.models.hf.encoder builds from a Hugging Face model folder (model.weights=<folder>) "
                          f"or from model.kwargs.architecture (one of {sorted(ENCODERS)}); give one")
    if architecture not in ENCODERS:
        raise ConfigError(f"model.kwargs.architecture = {architecture!r} is not one of {sorted(ENCODERS)}")
    model_name, config_name, takes = ENCODERS[architecture]
    cfg = config_with(getattr(transformers, config_name), config)
    cfg._attn_implementation = "eager"  # plain ops: the graph TensorRT sees does not depend on the machine
    model = getattr(transformers, model_name)(cfg)
    if architecture == "whisper_encoder":
        model = model.get_encoder()
    return Encoder(model.eval(), takes)


FLOATS = tuple(sorted(dtypes.name_of(d) for d in dtypes.FLOAT_DTYPES))


class Decoder(torch.nn.Module):
    """A `transformers` causal LM with its KV cache as buffers, as `transformers` exports for
    ExecuTorch (`TorchExportableModuleWithStaticCache`: a static cache of `max_cache_len` positions,
    the cache position an input). `step(tokens, start)` writes T tokens at positions start..start+T-1
    and returns the logits of each: prefill is a step from 0, decode a step of one token. Configs
    compile both methods from `step` with the same token range, so that they call one engine (the
    weights once, in the files and on the device)."""

    folder_loading: dict[str, list[str]] | None = None  # from a model folder: what transformers' loading left (from_folder)

    def __init__(self, model: Any, max_cache_len: int, tokenizer: str | None = None) -> None:  # a PreTrainedModel
        super().__init__()
        self.tokenizer = tokenizer  # the `pipeline.runtime.tokenizer` value the program carries, if any
        from transformers import GenerationConfig
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

        model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static", max_length=max_cache_len,
                                                   cache_config={"batch_size": 1, "max_cache_len": max_cache_len})
        self.max_cache_len = max_cache_len
        try:
            self.model = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_cache_len)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # KeyError: a layer kind it has no static form of
            raise ConfigError(f"a {type(model).__name__} gets no static KV cache from transformers ({first_line(exc)}); "
                              "decoder programs keep a KV cache, so this family cannot build as one") from exc
        recurrent = [type(layer).__name__ for layer in self.model.static_cache.layers if not hasattr(layer, "keys")]
        if recurrent:
            raise ConfigError(f"a {type(model).__name__} keeps a recurrent state ({recurrent[0]}), not only a KV cache; "
                              "decoder programs keep a KV cache, so this family cannot build as one")
        self._more_state: list[tuple[int, str]] = []  # (layer, attribute): cache state besides keys and values
        self._given: tuple[str, ...] = ()  # what each step gives the causal LM besides its tokens
        self._add_state(model)
        self._fit_cache(model)
        self._given = self._choose_given(model)

    def _add_state(self, model: Any) -> None:
        """State of a subclass's own that its steps read (none here); made before the first step."""

    def _fit_cache(self, model: Any) -> None:
        """Give each layer's static cache the heads and widths of the keys and values its attention
        writes, as one step of one token with a cache of its own finds them: transformers sizes the
        cache from the config's K/V heads and head width, which multi-query attention (Falcon,
        GPT-BigCode: one K/V head) and latent attention (DeepSeek-V2/V3, MiniCPM3: keys wider than
        values) do not write."""
        with torch.no_grad():
            out = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=model.device), use_cache=True)
        written = out.get("cache", out.get("past_key_values"))
        if written is None:
            if getattr(model.config, "is_decoder", None) is False:  # an encoder's causal LM: a decoder when asked
                raise ConfigError(f"a {type(model).__name__} keeps a KV cache only as a decoder; set "
                                  "model.kwargs.is_decoder=true")
            raise ConfigError(f"a {type(model).__name__} returns no KV cache from a step (transformers keeps none for it); "
                              "decoder programs keep a KV cache, so this family cannot build as one")
        for i, (layer, probe) in enumerate(zip(self.model.static_cache.layers, written.layers)):
            for kind, buffer in (("keys", f"key_cache_{i}"), ("values", f"value_cache_{i}")):
                have, wrote = getattr(layer, kind, None), getattr(probe, kind, None)
                if not isinstance(have, torch.Tensor) or not isinstance(wrote, torch.Tensor) or not have.numel():
                    continue  # a layer that shares another's cache keeps none
                shape = (have.shape[0], wrote.shape[1], have.shape[2], wrote.shape[3])
                if tuple(have.shape) != shape:
                    fitted = torch.zeros(shape, dtype=have.dtype, device=have.device)
                    setattr(layer, kind, fitted)
                    self.model.register_buffer(buffer, fitted, persistent=False)
        if any(_more_state(probe) for probe in written.layers):
            self._keep_more_state()

    def _keep_more_state(self) -> None:
        """State a cache layer makes on its first step besides keys and values (DeepSeek-V3.2's indexer
        keys) becomes buffers too, so the program keeps it: one step of one token through the static
        cache makes it at its static size; then every cache tensor starts from zeros again."""
        device = self._device
        with torch.no_grad():
            self.step(torch.zeros(1, 1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device))
        for i, layer in enumerate(self.model.static_cache.layers):
            for name in _more_state(layer):
                self.model.register_buffer(f"{name}_{i}", getattr(layer, name), persistent=False)
                self._more_state.append((i, name))
        self._reset_cache()

    def _choose_given(self, model: Any) -> tuple[str, ...]:
        """What each step gives the causal LM besides its tokens: its positions and a mask of the whole
        cache where it takes them (so that no size depends on a value), unless steps with them do not
        give the model's own logits (RoBERTa's positions start after its padding index): the first
        choice whose prompt and decode steps through the static cache give the logits of the model
        run whole on the same tokens.

        Raises:
            ConfigError: no choice does; the program would be wrong.
        """
        takes = inspect.signature(model.forward).parameters
        choices = [c for c in (("position_ids", "attention_mask"), ("attention_mask",), ("position_ids",), ())
                   if all(name in takes for name in c)]
        config = model.config.get_text_config()
        device = self._device
        tokens = torch.tensor([[5, 17, 3, 42, 9, 28]], device=device) % int(config.vocab_size)
        pad = getattr(config, "pad_token_id", None)
        if isinstance(pad, int):  # a padding token would be masked or embedded as nothing
            tokens = torch.where(tokens == pad, (tokens + 1) % int(config.vocab_size), tokens)
        tolerance = 1e-3 if model.dtype == torch.float32 else 5e-2
        with torch.no_grad():
            want = model(input_ids=tokens, use_cache=False).logits.float()
            worst = float("inf")
            for choice in choices:
                self._given = choice
                got = torch.cat([self.step(tokens[:, :4], torch.tensor([0], device=device)),
                                 self.step(tokens[:, 4:], torch.tensor([4], device=device))], dim=1).float()
                self._reset_cache()
                worst = min(worst, float((got - want).abs().max() / want.abs().max().clamp_min(1e-6)))
                if worst <= tolerance:
                    return choice
        raise ConfigError(f"a {type(model).__name__} stepped through a static KV cache does not give the logits it gives run "
                          f"whole (relative difference {worst:.2g}); this family cannot build as a decoder program")

    @property
    def _device(self) -> torch.device:
        """Where the cache lives (with the model)."""
        return next(buffer.device for buffer in self.model.buffers())

    def _reset_cache(self) -> None:
        """Every cache tensor (the wrapper's own buffers: the model's are named under `model.`) to zeros."""
        for name, buffer in self.model.named_buffers():
            if "." not in name:
                buffer.zero_()

    @property
    def program_constants(self) -> dict[str, int | str]:
        """Stored in the program as constant methods: what `pipeline.runtime.generate` checks
        against, and the tokenizer it encodes and decodes text with."""
        from pipeline.runtime import tokenizer

        return {"max_cache_len": self.max_cache_len, **({tokenizer.METHOD: self.tokenizer} if self.tokenizer else {})}

    @property
    def checkpoint_module(self) -> torch.nn.Module:
        """What a checkpoint of this model holds: the `transformers` causal LM's state dict."""
        return self.model.model

    def step(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Tokens [1, T] at positions start..start+T-1 (`start`: [1]); their logits [1, T, vocab]."""
        return self._run(torch.arange(tokens.shape[1], device=tokens.device) + start, input_ids=tokens)

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.step(tokens, torch.zeros(1, dtype=torch.int64, device=tokens.device))

    def decode(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return self.step(token, position)

    def _run(self, positions: torch.Tensor, **inputs: Any) -> torch.Tensor:
        """The logits of the step's tokens (`input_ids`) or their embeddings (`inputs_embeds`) at
        `positions`, with anything else `inputs` holds given to the causal LM (a step's own attention masks)."""
        # The cache object holds its own references to the tensors registered as buffers; point it
        # at the module's buffers as they are now, so that torch.export (which swaps in its own
        # tensors for buffers) sees the writes as buffer mutations and not as writes to constants.
        layers: list[Any] = list(self.model.static_cache.layers)
        for i, layer in enumerate(layers):
            layer.keys = getattr(self.model, f"key_cache_{i}")
            layer.values = getattr(self.model, f"value_cache_{i}")
            if hasattr(self.model, f"cumulative_length_{i}"):
                layer.cumulative_length = getattr(self.model, f"cumulative_length_{i}")
            for attr, value in list(vars(layer).items()):  # the devices it noted when made (its own, its
                if isinstance(value, torch.device):  # indexer's): the module may have moved since
                    setattr(layer, attr, layer.keys.device)
        for i, name in self._more_state:
            state = getattr(self.model, f"{name}_{i}")
            setattr(layers[i], name, state)
            if state.dim() == 0 and not state.is_floating_point():  # a length besides the cache's own: it
                state.copy_(positions[0])  # starts where the step starts, as the wrapper sets that one
        # The positions, and a mask of the whole cache, as inputs of the causal LM: families that derive
        # them from the cache's length as a number (OPT's and BioGPT's mask of start + T ones, XGLM's
        # arange of positions) make a size that depends on a value, which no engine takes. The
        # exportable wrapper passes neither, so they go in by a hook for the one call (those of them
        # that steps give the model's own logits with: `_choose_given`).
        given = {"position_ids": positions[None],
                 "attention_mask": torch.ones(1, self.max_cache_len, dtype=torch.long, device=positions.device)}
        given = {name: value for name, value in given.items() if name in self._given}
        step = {name: inputs.pop(name) for name in ("input_ids", "inputs_embeds") if name in inputs}
        given.update(inputs)

        def with_given(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            return args, {**kwargs, **given}

        handle = self.model.model.register_forward_pre_hook(with_given, with_kwargs=True)
        try:
            return self.model(**step, cache_position=positions)
        finally:
            handle.remove()

    def forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return self.step(tokens, start)


@model_factory
def decoder(architecture: str | None = None, max_cache_len: int = 0, dtype: str | None = None, *,
            attn_implementation: str | None = None, folder: str | None = None, **config: Any) -> torch.nn.Module:
    """The causal decoder of `architecture` (any causal-LM model type `transformers` has: llama,
    qwen2, mistral, gemma2, phi3, gpt2, ...) with a KV cache of `max_cache_len` positions, weights
    and cache in `dtype` (default float32), its config's defaults overridden by `config`
    (hidden_size, num_hidden_layers, ...); or, from a model `folder`, the causal LM its
    `config.json` names (dtype default: the folder's), fields overridden by `config`, carrying the
    folder's tokenizer, its weights loaded as transformers loads them. Attention is `sdpa` where the family supports
    it (one scaled_dot_product_attention per layer), else `eager`; `attn_implementation` overrides.
    Inference only: no parameter requires grad.

    Raises:
        ConfigError: an architecture that is not a causal LM of transformers, a dtype that is not a
            float, a cache of no positions, an attention transformers refuses for the family, a model
            that keeps no KV cache, or a folder whose model transformers cannot build.
    """
    from pipeline.runtime import tokenizer

    if folder is None and architecture is None:
        raise ConfigError("pipeline.models.hf.decoder builds from a Hugging Face model folder (model.weights=<folder>) "
                          "or from model.kwargs.architecture (a causal-LM model type of transformers, e.g. 'llama'); give one")
    if int(max_cache_len) < 1:
        raise ConfigError(f"model.kwargs.max_cache_len = {max_cache_len} must be at least 1")
    if folder is not None:
        cfg = folder_config(folder, architecture, config)
        model_class = causal_lm_class(cfg.model_type, f"model folder {folder!r}")
    else:
        model_class = causal_lm_class(str(architecture), "model.kwargs.architecture")
        cfg = config_with(type_config_class(str(architecture)), config)
    dtype = dtype or (str(cfg.dtype).removeprefix("torch.") if folder is not None and cfg.dtype is not None else "float32")
    row = dtypes.by_name(dtype)
    if row is None or not row.torch.is_floating_point:
        raise ConfigError(f"model.kwargs.dtype = {dtype!r} is not a floating-point dtype ({', '.join(FLOATS)})")
    cfg._attn_implementation = attn_implementation or ("sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager")
    if _has_experts(model_class):  # every token through its experts by gathered batched matmuls: shapes the
        cfg._experts_implementation = "batched_mm"  # tokens give (the default loops over experts that tokens chose)
    loaded = None
    try:
        if folder is not None:
            model, loaded = from_folder(model_class, cfg, folder, row.torch)
        else:
            model = model_class(cfg)
    except (ImportError, ValueError) as exc:
        if attn_implementation is None:
            raise
        raise ConfigError(f"model.kwargs.attn_implementation = {attn_implementation!r}: transformers refuses it for a "
                          f"{model_class.__name__} ({first_line(exc)}); drop it (sdpa where the family has it, else eager)") from exc
    model = model.to(row.torch).eval().requires_grad_(False)
    built = Decoder(model, int(max_cache_len), tokenizer.from_folder(folder) if folder is not None else None).eval()
    built.folder_loading = loaded
    return built


def _more_state(layer: Any) -> list[str]:
    """The tensors a cache layer holds besides its keys, values and length."""
    return [name for name, value in vars(layer).items()
            if isinstance(value, torch.Tensor) and name not in ("keys", "values", "cumulative_length")]


def _has_experts(model_class: Any) -> bool:
    can_set = getattr(model_class, "_can_set_experts_implementation", None)
    return bool(can_set and can_set())


def causal_lm_class(model_type: str, where: str) -> Any:
    """The `transformers` causal-LM class of `model_type` (its `AutoModelForCausalLM` entry).

    Raises:
        ConfigError: transformers has no causal LM of that type.
    """
    import difflib

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL_LMS

    name = CAUSAL_LMS.get(model_type)
    if name is None or not hasattr(transformers, name):
        close = difflib.get_close_matches(model_type, list(CAUSAL_LMS), n=3)
        raise ConfigError(f"{where}: {model_type!r} is not a causal-LM model type of transformers {transformers.__version__}"
                          + (f" (close: {close})" if close else "") + "; an encoder builds with pipeline.models.hf.encoder")
    return getattr(transformers, name)

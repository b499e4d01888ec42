"""Folders transformers saves, loaded as transformers loads them (issue 59): transformers 5 builds the
ViT family with new parameter names and renames a saved folder's keys as it loads it (its conversion
mapping, which covers ViT, DeiT, BEiT, ...); `model=hf_encoder model.weights=<folder>` loads a folder
the same way, so the encoder equals transformers' own, builds whole into one engine whose network the
CPU reference executor finds right, and a folder that does not fit its config is one line. Whisper
from a folder (`model=whisper`) takes its sizes from the folder's config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.errors import ConfigError

FAMILIES = {"vit": ("ViTModel", "ViTConfig"), "dinov2": ("Dinov2Model", "Dinov2Config"),
            "deit": ("DeiTModel", "DeiTConfig"), "beit": ("BeitModel", "BeitConfig"),
            "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig")}
KEYS_AS_SAVED = {"dinov2", "siglip_vision"}  # the families whose saved keys are the model's own
IMAGE = "model.methods.forward.inputs=[{shape: [1, 3, 32, 32]}]"


def _folder(path: Path, family: str) -> Path:
    import transformers

    model_class, config_class = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=64, image_size=32, patch_size=8)
    getattr(transformers, model_class)(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_vit_family_folder_loads_as_transformers_loads_it(family: str, tmp_path: Path) -> None:
    import transformers
    from safetensors import safe_open

    folder = _folder(tmp_path / family, family)
    reference = transformers.AutoModel.from_pretrained(folder, local_files_only=True, attn_implementation="eager").eval()
    with safe_open(str(folder / "model.safetensors"), "pt") as saved:
        renamed = set(saved.keys()) != set(reference.state_dict())
    encoder = objects.model(typed(compose(["model=hf_encoder", f"model.weights={folder}", IMAGE])))  # type: ignore[arg-type]
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = reference(pixel_values=x).last_hidden_state
        assert torch.equal(encoder(x), want), family
    assert renamed or family in KEYS_AS_SAVED  # the folder's keys are not the model's: transformers mapped them


def test_a_vit_folder_builds_whole_and_its_network_is_right(tmp_path: Path) -> None:
    from pipeline.steps import run_all

    folder = _folder(tmp_path / "vit", "vit")
    run_all(typed(compose(["model=hf_encoder", f"model.weights={folder}", IMAGE, "cache=off"])), tmp_path / "build")  # type: ignore[arg-type]
    report = json.loads((tmp_path / "build" / "report.json").read_text())["forward"]
    assert report["left_over"] == [] and report["num_engines"] == 1
    (engine,) = report["engines"]
    assert engine["reference"]["max_rel_error"] <= 1e-3, engine["reference"]


TOWERS = {"siglip": ("SiglipModel", "SiglipConfig"), "clip": ("CLIPModel", "CLIPConfig")}


def _two_towers(path: Path, family: str) -> Path:
    import transformers

    model_class, config_class = TOWERS[family]
    torch.manual_seed(0)
    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    config = getattr(transformers, config_class)(text_config={**sizes, "vocab_size": 100},
                                                 vision_config={**sizes, "image_size": 32, "patch_size": 8})
    getattr(transformers, model_class)(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("family", sorted(TOWERS))
def test_a_two_tower_folder_builds_the_tower_it_is_told(family: str, tmp_path: Path) -> None:
    """SigLIP's and CLIP's folders hold a text and a vision tower: `model.kwargs.tower=vision` builds
    the image encoder, equal to the pair's own vision tower as transformers loads it; a folder of
    towers without one named, or with one it lacks, is one line."""
    import transformers

    folder = _two_towers(tmp_path / family, family)
    reference = transformers.AutoModel.from_pretrained(folder, local_files_only=True, attn_implementation="eager").eval()
    image = typed(compose(["model=hf_encoder", f"model.weights={folder}", "model.kwargs.tower=vision", IMAGE]))
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(objects.model(image)(x), reference.vision_model(pixel_values=x).last_hidden_state)  # type: ignore[arg-type]
    for overrides, said in (([], "of towers ['text', 'vision']; an encoder program is one of them: set model.kwargs.tower"),
                            (["model.kwargs.tower=audio"], "model.kwargs.tower = 'audio': model folder"),
                            (["model.kwargs.tower=vision", "+model.kwargs.image_size=64"], "cannot load its weights")):
        with pytest.raises(ConfigError) as err:
            objects.model(typed(compose(["model=hf_encoder", f"model.weights={folder}", IMAGE, *overrides])))  # type: ignore[arg-type]
        assert said in str(err.value) and "\n" not in str(err.value), err.value


def test_a_siglip_image_encoder_builds_whole_and_its_network_is_right(tmp_path: Path) -> None:
    from pipeline.steps import run_all

    folder = _two_towers(tmp_path / "siglip", "siglip")
    run_all(typed(compose(["model=hf_encoder", f"model.weights={folder}", "model.kwargs.tower=vision", IMAGE,  # type: ignore[arg-type]
                           "cache=off"])), tmp_path / "build")
    report = json.loads((tmp_path / "build" / "report.json").read_text())["forward"]
    assert report["left_over"] == [] and report["num_engines"] == 1
    (engine,) = report["engines"]
    assert engine["reference"]["max_rel_error"] <= 1e-3, engine["reference"]


def test_a_folder_that_does_not_fit_is_one_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "vit", "vit")
    config = json.loads((folder / "config.json").read_text())

    def refused(*overrides: str) -> str:
        with pytest.raises(ConfigError) as err:
            objects.model(typed(compose(["model=hf_encoder", f"model.weights={folder}", IMAGE, *overrides])))  # type: ignore[arg-type]
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "drop model.weight_prefixes" in refused("+model.weight_prefixes={module.: ''}")
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    assert "lacks" in refused()  # the third layer: nothing in the folder sets it
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    assert "key(s) the model does not have" in refused()
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    assert "differ in shape" in refused() or "cannot load its weights" in refused()
    (folder / "config.json").write_text(json.dumps(config))
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert "is not safetensors (truncated or another format" in refused()


def test_whisper_from_a_folder_takes_the_folders_sizes(tmp_path: Path) -> None:
    """`model=whisper model.weights=<folder>`: a Whisper of sizes no config names here (d_model 96,
    three encoder layers and one decoder layer, 300 tokens) gives transformers' encoder states and
    logits."""
    import transformers

    torch.manual_seed(0)
    config = transformers.WhisperConfig(d_model=96, encoder_layers=3, decoder_layers=1, encoder_attention_heads=4,
                                        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=300,
                                        max_target_positions=64, decoder_start_token_id=1, eos_token_id=2, pad_token_id=0,
                                        bos_token_id=1)
    transformers.WhisperForConditionalGeneration(config).save_pretrained(tmp_path / "whisper")
    model = objects.model(typed(compose(["model=whisper", f"model.weights={tmp_path / 'whisper'}"])))  # type: ignore[arg-type]
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(
        tmp_path / "whisper", local_files_only=True, attn_implementation="eager").eval()
    features, tokens = torch.randn(1, 80, 3000), torch.tensor([[1, 5, 7, 299]])
    with torch.no_grad():
        assert torch.allclose(model.encoder(features), reference.model.encoder(features).last_hidden_state, atol=1e-5)
        want = reference(input_features=features, decoder_input_ids=tokens).logits
        assert torch.allclose(model.text_decoder(tokens, torch.tensor([0])), want, atol=1e-5)


_TEXT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 100}
_IMAGE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "image_size": 32,
          "patch_size": 8}
# One tiny size per family of the encoder table (docs/coverage.md), in the fields its config has.
TINY: dict[str, tuple[dict[str, Any], list[int]]] = {
    "bert": (_TEXT, [1, 8]), "roberta": (_TEXT, [1, 8]), "electra": (_TEXT, [1, 8]), "mpnet": (_TEXT, [1, 8]),
    "albert": (_TEXT, [1, 8]), "clip_text": (_TEXT, [1, 8]),
    "distilbert": ({"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "vocab_size": 100}, [1, 8]),
    "t5_encoder": ({"d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 2, "d_kv": 16, "vocab_size": 100}, [1, 8]),
    "vit": (_IMAGE, [1, 3, 32, 32]), "deit": (_IMAGE, [1, 3, 32, 32]), "beit": (_IMAGE, [1, 3, 32, 32]),
    "dinov2": ({**{k: v for k, v in _IMAGE.items() if k != "intermediate_size"}, "mlp_ratio": 2},
               [1, 3, 32, 32]), "clip_vision": (_IMAGE, [1, 3, 32, 32]), "siglip_vision": (_IMAGE, [1, 3, 32, 32]),
    "convnext": ({"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1], "image_size": 32}, [1, 3, 32, 32]),
    "swin": ({"embed_dim": 16, "depths": [1, 1], "num_heads": [1, 2], "image_size": 32, "patch_size": 4, "window_size": 2},
             [1, 3, 32, 32]),
    "whisper_encoder": ({"d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 2, "decoder_layers": 1,
                         "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64}, [1, 80, 3000]),
}


def test_every_encoder_family_has_a_tiny_size() -> None:
    from pipeline.models.hf import ENCODERS

    assert sorted(TINY) == sorted(ENCODERS)


@pytest.mark.parametrize("architecture", sorted(TINY))
def test_a_folder_of_every_encoder_family_loads(architecture: str, tmp_path: Path) -> None:
    """Each family of the encoder table, saved by transformers as the program's model is (`save_pretrained`
    of the encoder a config builds), loads from its folder into the same encoder."""
    from pipeline.models.hf import encoder

    fields, shape = TINY[architecture]
    torch.manual_seed(0)
    built = encoder(architecture, **fields)
    built.model.save_pretrained(tmp_path / architecture)
    tokens = ", dtype: int64, low: 0, high: 100" if len(shape) == 2 else ""
    loaded = objects.model(typed(compose(["model=hf_encoder", f"model.weights={tmp_path / architecture}",  # type: ignore[arg-type]
                                          f"model.methods.forward.inputs=[{{shape: {shape}{tokens}}}]"])))
    x = torch.randint(0, 100, shape) if len(shape) == 2 else torch.randn(shape)
    with torch.no_grad():
        assert torch.equal(loaded(x), built(x)), architecture


@pytest.mark.parametrize("family", ["t5_encoder", "whisper_encoder"])
def test_the_encoder_of_an_encoder_decoder_folder_is_its_encoder(family: str, tmp_path: Path) -> None:
    """A whole encoder-decoder's folder (T5ForConditionalGeneration, WhisperForConditionalGeneration)
    builds its encoder: what transformers' own encoder of that folder gives; the decoder's weights
    are not the program's."""
    import transformers

    fields, shape = TINY[family]
    kind = family.removesuffix("_encoder")
    config = transformers.CONFIG_MAPPING[kind](**fields)
    auto = transformers.AutoModelForSpeechSeq2Seq if kind == "whisper" else transformers.AutoModelForSeq2SeqLM
    torch.manual_seed(0)
    auto.from_config(config).save_pretrained(tmp_path / kind)
    reference = auto.from_pretrained(tmp_path / kind, attn_implementation="eager").eval()
    tokens = ", dtype: int64, low: 0, high: 100" if len(shape) == 2 else ""
    loaded = objects.model(typed(compose(["model=hf_encoder", f"model.weights={tmp_path / kind}",  # type: ignore[arg-type]
                                          f"model.methods.forward.inputs=[{{shape: {shape}{tokens}}}]"])))
    x = torch.randint(0, 100, shape) if len(shape) == 2 else torch.randn(shape)
    with torch.no_grad():
        assert torch.equal(loaded(x), reference.get_encoder()(x).last_hidden_state)

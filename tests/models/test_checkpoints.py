"""Trained weights from files (`model.weights`): every format builds the model the eager one loaded
from the same file is, a Hugging Face folder builds its decoder with its tokenizer (text in and out
of `generate`, token for token with transformers' own greedy generation), and every bad file is one
line with nothing built."""

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.errors import ConfigError
from pipeline.models.mlp import MLP
from pipeline.models.weight_files import digests
from tests.helpers import GPU

ROOT = Path(__file__).resolve().parents[2]
LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 128}


def trained_mlp() -> MLP:
    """An MLP with weights no seed of the config draws."""
    torch.manual_seed(1234)
    return MLP().eval()


def built(*overrides: str) -> torch.nn.Module:
    return objects.model(typed(compose(["model=mlp", *overrides])))  # type: ignore[arg-type]


def save_sharded(state: dict[str, torch.Tensor], folder: Path) -> Path:
    keys = sorted(state)
    half = len(keys) // 2
    weight_map = {}
    for name, part in (("model-00001-of-00002.safetensors", keys[:half]), ("model-00002-of-00002.safetensors", keys[half:])):
        save_file({k: state[k].contiguous() for k in part}, str(folder / name))
        weight_map.update(dict.fromkeys(part, name))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


class Wrapper(torch.nn.Module):
    """What a training script saves when it wraps the model (DataParallel's `module.` prefix)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


@pytest.mark.parametrize("fmt", ["safetensors", "sharded", "state_dict", "timm", "wrapped"])
def test_every_format_builds_the_trained_model(tmp_path: Path, fmt: str) -> None:
    trained = trained_mlp()
    state = trained.state_dict()
    overrides = []
    if fmt == "safetensors":
        path = tmp_path / "mlp.safetensors"
        save_file(state, str(path))
    elif fmt == "sharded":
        path = save_sharded(state, tmp_path)
    elif fmt == "state_dict":
        torch.save(state, path := tmp_path / "mlp.pt")
    elif fmt == "timm":  # timm's train.py: the state dict beside the epoch, arch and optimizer's
        torch.save({"epoch": 3, "arch": "mlp", "state_dict": state, "optimizer": {"lr": 0.1}}, path := tmp_path / "best.pth.tar.pth")
    else:
        torch.save(Wrapper(trained).state_dict(), path := tmp_path / "wrapped.bin")
        overrides = ["+model.weight_prefixes={module.: ''}"]
    x = torch.randn(4, 64)
    model = built(f"model.weights={path}", *overrides)
    with torch.no_grad():
        assert torch.equal(model(x), trained(x))
        assert not torch.equal(built()(x), trained(x))  # the seeded model is another one
    assert [d["file"] for d in digests(path)][-1].endswith((".safetensors", ".pt", ".pth", ".bin"))


def test_a_program_built_from_a_checkpoint_records_its_digest(tmp_path: Path) -> None:
    """`python -m pipeline` with `model.weights`: the engines are built from the file's weights (the
    compile step's model is the trained one) and the manifest names the file by digest."""
    path = tmp_path / "mlp.safetensors"
    save_file(trained_mlp().state_dict(), str(path))
    run = subprocess.run([sys.executable, "-m", "pipeline", f"model.weights={path}", f"hydra.run.dir={tmp_path}/run"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    manifest = json.loads(next((tmp_path / "run").rglob("manifest.json")).read_text())
    assert manifest["weights"] == {"path": str(path), "files": digests(path)}


def _refusal(tmp_path: Path, weights: Path, *overrides: str) -> str:
    run = subprocess.run([sys.executable, "-m", "pipeline", f"model.weights={weights}", *overrides,
                          f"hydra.run.dir={tmp_path}/run"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr[-3000:]
    assert not list((tmp_path / "run").rglob("*.pte"))
    return run.stderr


class Code:
    """An object whose pickle names code."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("ran code",))


def test_bad_weight_files_are_one_line_and_nothing_is_built(tmp_path: Path) -> None:
    state = trained_mlp().state_dict()
    good = tmp_path / "good.safetensors"
    save_file(state, str(good))
    (tmp_path / "truncated.safetensors").write_bytes(good.read_bytes()[:100])
    (tmp_path / "foreign.safetensors").write_text("name,value\nlr,0.1\n")
    (tmp_path / "link.safetensors").symlink_to(good)
    torch.save({"inp.weight": Code()}, tmp_path / "code.pt")
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps({"inp.weight": Code()}))  # a plain pickle, not torch.save's zip
    outside = tmp_path / "shards"
    outside.mkdir()
    (outside / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"inp.weight": "../good.safetensors"}}))
    cases = {
        tmp_path / "missing.safetensors": "does not exist",
        tmp_path / "truncated.safetensors": "is not a readable safetensors file (truncated, or another format",
        tmp_path / "foreign.safetensors": "is not a readable safetensors file",
        tmp_path / "link.safetensors": "is a symbolic link",
        tmp_path / "code.pt": "would run code to load",
        tmp_path / "legacy.pt": "would run code to load",
        outside / "model.safetensors.index.json": "names shard '../good.safetensors', which is not a file in the index's own folder",
        outside: "is a folder without config.json",
        tmp_path / "notes.txt": "is not a weight file this pipeline reads",
    }
    (tmp_path / "notes.txt").write_text("x")
    for path, message in cases.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            built(f"model.weights={path}")
    # From the command line: refused before Hydra starts (missing) or when the compile step reads
    # the file (truncated), in one line, with no program written.
    for name in ("missing.safetensors", "truncated.safetensors"):
        assert cases[tmp_path / name] in _refusal(tmp_path, tmp_path / name)
    # Weights that do not fit the model the config builds: each names keys and the fix.
    with pytest.raises(ConfigError, match=r"2 key\(s\) differ in shape .* first 'out.bias': \[10\] in the file, \[3\]"):
        built(f"model.weights={good}", "+model.kwargs.out_features=3")
    with pytest.raises(ConfigError, match=r"differ in dtype .*build the model in the file's dtype"):
        save_file({k: v.half() for k, v in state.items()}, str(half := tmp_path / "half.safetensors"))
        built(f"model.weights={half}")
    save_file({k: v for k, v in state.items() if k != "out.bias"}, str(part := tmp_path / "part.safetensors"))
    with pytest.raises(ConfigError, match=r"lacks 1 key\(s\) of the model: 'out.bias'.*model.weights_partial=true"):
        built(f"model.weights={part}")
    assert torch.equal(built(f"model.weights={part}", "model.weights_partial=true").out.bias, built().out.bias)
    save_file({f"net.{k}": v for k, v in state.items()}, str(prefixed := tmp_path / "prefixed.safetensors"))
    with pytest.raises(ConfigError, match=r"sets 6 key\(s\) the model does not have: 'net.inp.bias'.*"
                                          r"model.weight_prefixes=\{'net.': ''\}"):
        built(f"model.weights={prefixed}")
    with pytest.raises(ConfigError, match="model.init = 'every_layer' sets up random weights"):
        compose(["model=mlp", f"model.weights={good}", "model.init=every_layer"])


def hf_folder(path: Path, **config: object) -> Path:
    """A Llama saved by `save_pretrained`, with a byte-level BPE tokenizer trained on a few sentences."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, "eos_token_id": 2, **config}))
    model.save_pretrained(path)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran in the park", "the cat and the dog"],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(path / "tokenizer.json"))
    return path


def test_a_model_folder_builds_its_decoder_and_generates_text(tmp_path: Path) -> None:
    """`model=hf_decoder model.weights=<folder>`: the decoder its config.json names, with its weights
    (its output head tied to nothing here, so every key comes from the file); the program carries its
    tokenizer, and `generate --prompt TEXT` prints what transformers' greedy `generate` does."""
    import transformers
    from torch.export import Dim

    from pipeline.lowering.compile import export_method
    from pipeline.lowering.serialize import save
    from pipeline.models.decoder import MethodView

    folder = hf_folder(tmp_path / "llama")
    cfg = typed(compose(["model=hf_decoder", f"model.weights={folder}", "model.kwargs.max_cache_len=48"]))
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    tokens = torch.randint(0, 300, (1, 6))
    with torch.no_grad():  # (an eager step writes the cache: the program is exported from a fresh build)
        assert torch.allclose(objects.model(cfg).step(tokens, torch.tensor([0])), reference(tokens).logits, atol=1e-5)  # type: ignore[arg-type]
    decoder = objects.model(cfg)  # type: ignore[arg-type]
    # The program as the build writes it, without engines (it runs here): prefill and decode, its constants.
    example = (torch.zeros(1, 4, dtype=torch.int64), torch.tensor([0]))
    methods = {m: export_method(MethodView(decoder, "step"), example, (({1: Dim("tokens", min=1, max=48)}, {}),))
               for m in ("prefill", "decode")}
    pte = save(methods, tmp_path / "llama.pte", constant_methods=decoder.program_constants)["pte"]
    prompt = "the cat sat on"
    run = subprocess.run([sys.executable, "-m", "pipeline.runtime.generate", str(pte), "--prompt", prompt,
                          "--max-new-tokens", "32"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = torch.tensor([tok.encode(prompt).ids])
    with torch.no_grad():
        expected = reference.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=2)[0, ids.shape[1]:].tolist()
    if 2 in expected:
        expected = expected[:expected.index(2)]
    assert run.stdout.split("\n")[0] == tok.decode(expected, skip_special_tokens=True)
    assert f"{len(expected) + (len(expected) < 32)} tokens in" in run.stdout or f"{len(expected)} tokens in" in run.stdout
    # A program without a tokenizer says how to give it ids.
    seeded = save(methods, tmp_path / "seeded.pte", constant_methods={"max_cache_len": 48})["pte"]
    run = subprocess.run([sys.executable, "-m", "pipeline.runtime.generate", str(seeded), "--prompt", prompt],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 2 and "the program carries no tokenizer" in run.stderr and "--prompt-ids" in run.stderr


def test_model_folders_run_no_code_and_name_what_they_lack(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "llama")
    config = json.loads((folder / "config.json").read_text())

    def refused(changed: dict[str, object], *overrides: str) -> str:
        (folder / "config.json").write_text(json.dumps({**config, **changed}))
        with pytest.raises(ConfigError) as err:
            objects.model(typed(compose(["model=hf_decoder", f"model.weights={folder}", *overrides])))
        return str(err.value)

    assert "names code of its own (auto_map" in refused({"auto_map": {"AutoConfig": "mine.Config"}})
    assert "trust_remote_code is refused" in refused({"auto_map": {"AutoConfig": "mine.Config"}})
    assert "names model_type 'llamazing', which transformers" in refused({"model_type": "llamazing"})
    assert "is a 'llama' model; drop model.kwargs.architecture" in refused({}, "+model.kwargs.architecture=qwen2")
    assert "lacks" in refused({"num_hidden_layers": 3}) or "differ" in refused({"num_hidden_layers": 3})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.model").write_bytes(b"sentencepiece")
    assert "has tokenizer.model but no tokenizer.json" in refused({})
    with pytest.raises(ConfigError, match="only a factory that takes `folder` builds from"):
        built(f"model.weights={folder}")


def test_a_model_folder_builds_its_encoder(tmp_path: Path) -> None:
    """`model=hf_encoder model.weights=<folder>`: the base model a folder's config.json names (here a
    BERT), with the folder's weights: the last hidden state transformers' own model gives."""
    import transformers

    torch.manual_seed(3)
    transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                   intermediate_size=64, vocab_size=100)).save_pretrained(tmp_path / "bert")
    cfg = typed(compose(["model=hf_encoder", f"model.weights={tmp_path / 'bert'}"]))
    encoder = objects.model(cfg)  # type: ignore[arg-type]
    reference = transformers.AutoModel.from_pretrained(tmp_path / "bert", local_files_only=True, attn_implementation="eager").eval()
    tokens = torch.randint(0, 100, (1, 16))
    with torch.no_grad():
        assert torch.allclose(encoder(tokens), reference(input_ids=tokens).last_hidden_state, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_a_model_folder_built_to_engines_generates_transformers_text(tmp_path: Path) -> None:
    """The whole build (`run_all`: TensorRT engines) of a folder's decoder, run on the GPU:
    `generate --prompt TEXT` prints the text transformers' greedy generation gives, 32 tokens."""
    import transformers
    from tokenizers import Tokenizer

    from pipeline.steps import run_all

    folder = hf_folder(tmp_path / "llama")
    files = run_all(typed(compose(["model=hf_decoder", f"model.weights={folder}"])),  # type: ignore[arg-type]
                    tmp_path / "build")
    prompt = "the cat sat on"
    run = subprocess.run([sys.executable, "-m", "pipeline.runtime.generate", str(files["pte"]), "--prompt", prompt,
                          "--max-new-tokens", "32"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = torch.tensor([tok.encode(prompt).ids])
    with torch.no_grad():
        expected = reference.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=2)[0, ids.shape[1]:].tolist()
    expected = expected[:expected.index(2)] if 2 in expected else expected
    assert run.stdout.split("\n")[0] == tok.decode(expected, skip_special_tokens=True)

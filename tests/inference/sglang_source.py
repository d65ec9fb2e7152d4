"""SGLang's own definitions, read from the installed package's source files with `ast` (nothing of it is imported:
importing sglang needs CUDA and a hundred dependencies; `pip install --no-deps sglang==PIN` gives the sources).

    defs = read_definitions(sglang_root())
    defs.routes["/generate"].methods            # {"POST", "PUT"}
    defs.fields["GenerateReqInput"]             # {"input_ids": False, ...}: name -> required (no default)

and `request_violations` / `read_violations` compare what rl360 sends and reads with them.
Used by tests/inference/test_sglang_conformance.py.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The version the recipes launch (pyproject.toml's `gpu` extra pins the same).
SGLANG_PIN = "0.5.23"


def sglang_root() -> Path | None:
    """The installed `sglang` package folder, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Route:
    methods: frozenset[str]
    handler: str
    # The class its JSON body is parsed into, and whether the body may be left out.
    body: str | None = None
    body_required: bool = False
    # Every constant key of a dict literal in the handler: what its answers can hold.
    answer_keys: frozenset[str] = frozenset()


@dataclass
class Definitions:
    routes: dict[str, Route]
    # class name -> {field name: required}
    fields: dict[str, dict[str, bool]]
    # The /generate contract gate (sglang/api/v1/api_types.py): top-level and sampling_params keys.
    contract_generate: set[str]
    contract_sampling: set[str]
    # Keys of the /generate answer, of its meta_info, of a finish_reason.
    answer_keys: set[str]
    meta_info_keys: set[str]
    finish_reason_keys: set[str]
    # ServerArgs fields (`--flag-name` is `flag_name`), for the launch command.
    server_args: set[str] = field(default_factory=set)

    def copy(self) -> Definitions:
        return dataclasses.replace(self, routes=dict(self.routes),
                                   fields={k: dict(v) for k, v in self.fields.items()})


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _const_keys(node: ast.AST) -> set[str]:
    return {k.value for d in ast.walk(node) if isinstance(d, ast.Dict)
            for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def class_fields(module: ast.Module) -> dict[str, dict[str, bool]]:
    """Annotated class attributes per class, base classes of the same module included (dataclasses, msgspec)."""
    classes = {n.name: n for n in module.body if isinstance(n, ast.ClassDef)}
    done: dict[str, dict[str, bool]] = {}

    def of(name: str) -> dict[str, bool]:
        if name in done:
            return done[name]
        node = classes[name]
        out: dict[str, bool] = {}
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                out.update(of(base.id))
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if "ClassVar" in ast.unparse(stmt.annotation):
                    continue
                out[stmt.target.id] = stmt.value is None
        done[name] = out
        return out

    for name in classes:
        of(name)
    return done


def _route_of(decorator: ast.expr) -> tuple[str, frozenset[str]] | None:
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
            and isinstance(decorator.func.value, ast.Name) and decorator.func.value.id == "app"):
        return None
    verb = decorator.func.attr
    if not decorator.args or not isinstance(decorator.args[0], ast.Constant):
        return None  # a path from the environment (Vertex, Ollama): not one rl360 uses
    path = decorator.args[0].value
    if verb in ("get", "post", "put", "delete"):
        return path, frozenset({verb.upper()})
    if verb == "api_route":
        for kw in decorator.keywords:
            if kw.arg == "methods" and isinstance(kw.value, (ast.List, ast.Tuple)):
                return path, frozenset(e.value for e in kw.value.elts if isinstance(e, ast.Constant))
        return path, frozenset({"GET"})
    return None


def _body_param(fn: ast.FunctionDef | ast.AsyncFunctionDef, known: set[str]) -> tuple[str | None, bool]:
    """The class a handler parses its JSON body into (`Annotated[X, Body()]`, or a bare request class)."""
    args = fn.args.args
    defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
    for arg, default in zip(args, defaults):
        ann = arg.annotation
        name = None
        if isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "Annotated":
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if any(isinstance(p, ast.Call) and isinstance(p.func, ast.Name) and p.func.id == "Body" for p in parts):
                inner = parts[0]
                if isinstance(inner, ast.Subscript):  # Optional[X]
                    inner = inner.slice
                name = inner.id if isinstance(inner, ast.Name) else None
        elif isinstance(ann, ast.Name) and ann.id in known:
            name = ann.id
        if name is not None:
            return name, default is None
    return None, False


def routes(module: ast.Module, known: set[str]) -> dict[str, Route]:
    out: dict[str, Route] = {}
    for fn in module.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        found = [r for r in (_route_of(d) for d in fn.decorator_list) if r is not None]
        if not found:
            continue
        body, required = _body_param(fn, known)
        for path, methods in found:
            out[path] = Route(methods=methods, handler=fn.name, body=body, body_required=required,
                              answer_keys=frozenset(_const_keys(fn)))
    return out


def _meta_info_keys(module: ast.Module) -> set[str]:
    keys: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "meta_info" and isinstance(node.value, ast.Dict):
                    keys |= _const_keys(node.value)
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                        and target.value.id == "meta_info" and isinstance(target.slice, ast.Constant)):
                    keys.add(target.slice.value)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "meta_info"):
            keys |= _const_keys(node)
    return keys


def _answer_keys(module: ast.Module) -> set[str]:
    """Keys of every dict literal that holds a `meta_info`: the shapes of the /generate answer."""
    keys: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Dict):
            own = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if "meta_info" in own:
                keys |= own
    return keys


def _finish_reason_keys(module: ast.Module) -> set[str]:
    keys: set[str] = set()
    for cls in module.body:
        if isinstance(cls, ast.ClassDef) and cls.name.startswith("FINISH"):
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "to_json":
                    keys |= _const_keys(fn)
    return keys


def _server_args(root: Path) -> set[str]:
    names: set[str] = set()
    for path in sorted((root / "srt" / "arg_groups" / "fields").glob("*.py")):
        for fields in class_fields(_parse(path)).values():
            names |= set(fields)
    # Options the parser adds itself (server_args.py: `parser.add_argument("--config", ...)`).
    for node in ast.walk(_parse(root / "srt" / "server_args.py")):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("--")):
            names.add(node.args[0].value[2:].replace("-", "_"))
    return names


def read_definitions(root: Path) -> Definitions:
    srt = root / "srt"
    io_struct = class_fields(_parse(srt / "managers" / "io_struct.py"))
    contract = class_fields(_parse(root / "api" / "v1" / "api_types.py"))
    tokenizer_manager = _parse(srt / "managers" / "tokenizer_manager.py")
    return Definitions(
        routes=routes(_parse(srt / "entrypoints" / "http_server.py"), set(io_struct)),
        fields=io_struct,
        contract_generate=set(contract["GenerateRequest"]),
        contract_sampling=set(contract["SamplingParams"]),
        answer_keys=_answer_keys(tokenizer_manager),
        meta_info_keys=_meta_info_keys(tokenizer_manager),
        finish_reason_keys=_finish_reason_keys(_parse(srt / "managers" / "schedule_batch.py")),
        server_args=_server_args(root),
    )


# ----------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Sent:
    """One request as it went over the wire."""

    method: str
    path: str
    body: Any  # the parsed JSON body, or None when there was none
    authorization: str | None


def request_violations(sent: list[Sent], defs: Definitions) -> list[str]:
    """Everything in `sent` that SGLang would not take as meant: an unknown route or method, a missing
    required body or field, a field SGLang does not define (it would be dropped silently)."""
    out: list[str] = []
    for s in sent:
        where = f"{s.method} {s.path}"
        route = defs.routes.get(s.path)
        if route is None:
            out.append(f"{where}: SGLang has no route {s.path}")
            continue
        if s.method not in route.methods:
            out.append(f"{where}: SGLang's {s.path} takes {sorted(route.methods)}")
        if route.body is None:
            continue
        if s.body is None:
            if route.body_required:
                out.append(f"{where}: sends no JSON body; SGLang requires one ({route.body})")
            continue
        if not isinstance(s.body, dict):
            out.append(f"{where}: the body is a {type(s.body).__name__}, not an object")
            continue
        fields = defs.fields[route.body]
        out += [f"{where}: field {k!r} is not in SGLang's {route.body}" for k in s.body if k not in fields]
        out += [f"{where}: required field {k!r} of {route.body} is missing"
                for k, required in fields.items() if required and k not in s.body]
        if s.path == "/generate":
            out += [f"{where}: field {k!r} is not in SGLang's /generate contract (GenerateRequest)"
                    for k in s.body if k not in defs.contract_generate]
            params = s.body.get("sampling_params") or {}
            # The contract's SamplingParams rejects unknown keys: a 400 on a real engine.
            out += [f"{where}: sampling_params.{k} is not in SGLang's SamplingParams" for k in params
                    if k not in defs.contract_sampling]
    return out


def read_violations(reads: set[tuple[str, str]], defs: Definitions) -> list[str]:
    """Response keys rl360 reads, (where, key), that SGLang's answers do not hold."""
    known = {"/generate": defs.answer_keys, "meta_info": defs.meta_info_keys,
             "finish_reason": defs.finish_reason_keys}
    out = []
    for where, key in sorted(reads):
        keys = known.get(where)
        if keys is None:
            route = defs.routes.get(where)
            keys = set(route.answer_keys) if route else set()
        if key not in keys:
            out.append(f"rl360 reads {key!r} from {where}, which SGLang's answer does not hold")
    return out


class RecordingDict(dict):
    """A JSON object that notes which keys are read from it (and from the objects inside it)."""

    def __init__(self, data: dict, where: str, log: set[tuple[str, str]]):
        super().__init__(data)
        self.where = where
        self.log = log

    def _wrap(self, key: str, value: Any) -> Any:
        return RecordingDict(value, key, self.log) if isinstance(value, dict) else value

    def __getitem__(self, key: str) -> Any:
        self.log.add((self.where, key))
        return self._wrap(key, super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        self.log.add((self.where, key))
        return self._wrap(key, super().get(key, default))

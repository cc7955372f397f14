"""Pre-quantized checkpoints: the compressed-tensors FP8 layout of published FP8 Llama 3.x models.

Such a checkpoint's config.json carries a `quantization_config` like

    {"quant_method": "compressed-tensors", "format": "float-quantized",
     "config_groups": {"group_0": {"targets": ["Linear"],
         "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
                     "dynamic": false, "group_size": null},
         "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                               "dynamic": true}}},
     "ignore": ["lm_head"]}

(older exporters, such as the one that wrote neuralmagic's Meta-Llama-3.1-8B-Instruct-FP8, say
`"format": "naive-quantized"`: for FP8 weights the same tensors), and each quantized linear
layer `X` holds `X.weight` (F8_E4M3, [out, in]) and `X.weight_scale`
(one scale per output channel, [out, 1], or one per matrix, [1] or []), and with static
activation scales also `X.input_scale` ([1] or []). The weight is `weight * weight_scale`.

sv reads FP8 weights with channel or tensor scales; activations are always quantized per
token at run time by the kernels that use them, so an `input_scale` is checked and not used.
Anything else (int4 packs, group scales, asymmetric weights, regex ignore lists, an ignore
list that leaves part of a layer's q/k/v or gate/up unquantized) is refused with a message that
names the field.

A calibrated FP8 KV cache (llm-compressor's `kv_cache_scheme`, e.g. `{"num_bits": 8, "type":
"float", "strategy": "tensor", "dynamic": false, "symmetric": true}`) adds one K and one V
scale per layer: `model.layers.N.self_attn.k_scale` and `.v_scale` ([] or [1]). Other
exporters spell them as vLLM also loads them for Llama: `self_attn.k_proj.output_scale` and
`self_attn.v_proj.output_scale` (older compressed-tensors), `self_attn.k_proj.k_scale` and
`self_attn.v_proj.v_scale` (ModelOpt), or one `self_attn.kv_scale` that is both the K and the V
scale (older AutoFP8). A layer may hold each scale under one name only. K and V are stored as e4m3 of K / k_scale and V / v_scale: with an
FP8 KV cache sv uses them as the pool's scales (`sv_model.KVCache`), for every KV head of the
layer; with a BF16 or FP32 cache they are not needed and are ignored, as vLLM ignores them.
They are in every layer or in none (none: the scales are 1, as vLLM's default). sv honours
only that scheme: per-head or per-channel KV scales, integer KV caches and dynamic scales are
refused, naming the field.

llm-compressor can also calibrate the KV cache alone: then no config group quantizes a weight
(`"config_groups": {}`, or null, or no key; `"format": "dense"`, or one of the FP8 formats
above) and every weight is stored plain (BF16, F16 or F32), beside the same K and V scales.
sv loads such a checkpoint's weights as a plain one's (no weight may then be FP8 or have a
`weight_scale`) and checks and uses its scales as above; `--quantization` treats the
weights as any plain checkpoint's (`sv_engine.options`). A config with
neither a group nor a `kv_cache_scheme` quantizes nothing, and the checkpoint is read as a
plain one, as vLLM runs it. More than one group, or a group with `"format": "dense"`, is
refused, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sv_weights.errors import WeightsError
from sv_weights.json_files import read_json_file
from sv_weights.safetensors import TensorInfo

QUANT_METHOD = "compressed-tensors"
# The formats whose FP8 weights are stored as they are (float8_e4m3fn with their scales).
_FORMATS = ("float-quantized", "naive-quantized")
# The format of weights stored plain, as a KV-cache-only calibration writes them (module doc).
DENSE_FORMAT = "dense"
FP8_DTYPE = "F8_E4M3"
SCALE_DTYPES = frozenset({"F32", "BF16", "F16"})
WEIGHT_SCALE = "_scale"  # "X.weight" -> "X.weight_scale"
INPUT_SCALE = "input_scale"

# The modules sv runs as one matrix (sv_model.weights packs their rows): all FP8 or none.
PACKED_GROUPS = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("mlp.gate_proj", "mlp.up_proj"),
)

Strategy = Literal["channel", "tensor"]


# A calibrated KV cache's per-layer scales, under "model.layers.N.self_attn.": sv's name of
# each (llm-compressor's, first) and every spelling of it that sv reads (module doc).
KV_SCALE_SPELLINGS = {
    "k_scale": ("k_scale", "k_proj.output_scale", "k_proj.k_scale", "kv_scale"),
    "v_scale": ("v_scale", "v_proj.output_scale", "v_proj.v_scale", "kv_scale"),
}


@dataclass(frozen=True)
class FP8Quantization:
    """A checkpoint's FP8 scheme: the weights' scale strategy (None: no config group, so no
    weight is quantized, as in a KV-cache-only calibration) and the modules left unquantized;
    `kv_cache`: the config declares a static per-tensor FP8 KV cache (`kv_cache_scheme`), so
    each layer may hold its K and V scales (module doc)."""

    strategy: Strategy | None
    ignore: frozenset[str]
    kv_cache: bool = False

    @property
    def quantizes_weights(self) -> bool:
        """Whether a config group makes linear weights FP8 (else every weight is plain)."""
        return self.strategy is not None

    def quantizes(self, module: str) -> bool:
        """Whether the linear module `module` (e.g. "model.layers.0.mlp.up_proj") is FP8."""
        short = module.rsplit(".", 1)[-1]
        return self.quantizes_weights and module not in self.ignore and short not in self.ignore

    def check_tensors(
        self, linear_weights: dict[str, tuple[int, ...]], infos: dict[str, TensorInfo], source: str
    ) -> set[str]:
        """Check each quantized linear weight's dtype and its scales (`linear_weights`: weight
        name -> expected shape); return the names of the scale tensors found (the weights'
        `weight_scale`s and any `input_scale`s), which the plain validation must accept."""
        self._check_packed_groups(linear_weights, source)
        scales: set[str] = set()
        for name, shape in linear_weights.items():
            module = name.removesuffix(".weight")
            quantized = self.quantizes(module)
            info = infos.get(name)
            scale_name = name + WEIGHT_SCALE
            input_name = f"{module}.{INPUT_SCALE}"
            if not quantized:
                why = (
                    "quantization_config.ignore leaves unquantized"
                    if self.quantizes_weights
                    else "quantization_config leaves unquantized (it has no config_groups)"
                )
                for extra in (scale_name, input_name):
                    if extra in infos:
                        raise WeightsError(
                            f"{source}: {extra!r} belongs to {module!r}, which {why}"
                        )
                continue
            if info is None:  # the check of missing tensors names it: it is not FP8, it is absent
                continue
            if info.shape != shape:  # named here, before its scales
                raise WeightsError(
                    f"{source}: tensor {name!r} has shape {list(info.shape)}, expected "
                    f"{list(shape)} from config.json"
                )
            if info.dtype != FP8_DTYPE:
                raise WeightsError(
                    f"{source}: tensor {name!r} has dtype {info.dtype}; quantization_config "
                    f"quantizes {module!r}, so expected {FP8_DTYPE}"
                )
            scale = infos.get(scale_name)
            if scale is None:
                raise WeightsError(
                    f"{source}: {name!r} is FP8 but its scales {scale_name!r} are missing"
                )
            expected = [(shape[0], 1)] if self.strategy == "channel" else [(1,), ()]
            if scale.shape not in expected:
                raise WeightsError(
                    f"{source}: {scale_name!r} has shape {list(scale.shape)}, expected "
                    f"{' or '.join(str(list(s)) for s in expected)} ({self.strategy} scales)"
                )
            scales.add(scale_name)
            input_scale = infos.get(input_name)
            if input_scale is not None:
                if input_scale.shape not in ((1,), ()):
                    raise WeightsError(
                        f"{source}: {input_name!r} has shape {list(input_scale.shape)}, expected "
                        "[1] or [] (one static activation scale per matrix)"
                    )
                scales.add(input_name)
            for found in (scale, input_scale):
                if found is not None and found.dtype not in SCALE_DTYPES:
                    raise WeightsError(
                        f"{source}: {found.name!r} has dtype {found.dtype}, expected one of "
                        f"{', '.join(sorted(SCALE_DTYPES))}"
                    )
        return scales

    def check_kv_scales(
        self, num_layers: int, infos: dict[str, TensorInfo], source: str
    ) -> dict[str, str]:
        """Check a calibrated KV cache's scales (module doc): in every layer or in none, one
        name each, [] or [1], a scale dtype. Returns sv's name (`kv_scale_name`) -> the file's
        tensor of those found."""
        found = kv_scales_in(num_layers, infos, source)
        if found and not self.kv_cache:
            raise WeightsError(
                f"{source}: tensor {min(found.values())!r} is a KV-cache scale, but "
                "quantization_config has no kv_cache_scheme saying how to use it"
            )
        if found and len(found) != 2 * num_layers:
            missing = next(
                kv_scale_name(layer, which)
                for layer in range(num_layers)
                for which in KV_SCALE_SPELLINGS
                if kv_scale_name(layer, which) not in found
            )
            raise WeightsError(
                f"{source}: tensor {missing!r} is missing: a calibrated KV cache has k_scale and "
                f"v_scale in every layer or in none, and this one has {len(found)} of "
                f"{2 * num_layers} (e.g. {min(found.values())!r})"
            )
        for name in sorted(set(found.values())):
            info = infos[name]
            if info.shape not in ((), (1,)):
                raise WeightsError(
                    f"{source}: {name!r} has shape {list(info.shape)}, expected [1] or [] "
                    "(one KV-cache scale per layer)"
                )
            if info.dtype not in SCALE_DTYPES:
                raise WeightsError(
                    f"{source}: {name!r} has dtype {info.dtype}, expected one of "
                    f"{', '.join(sorted(SCALE_DTYPES))}"
                )
        return found

    def _check_packed_groups(self, linear_weights: dict[str, tuple[int, ...]], source: str) -> None:
        """Raise WeightsError when `ignore` leaves part of a packed group (PACKED_GROUPS)
        unquantized and quantizes the rest."""
        for name in linear_weights:
            for group in PACKED_GROUPS:
                if not name.endswith(f".{group[0]}.weight"):
                    continue
                layer = name.removesuffix(f"{group[0]}.weight")
                modules = [layer + member for member in group]
                quantized = [m for m in modules if self.quantizes(m)]
                plain = [m for m in modules if not self.quantizes(m)]
                if quantized and plain:
                    raise WeightsError(
                        f"{source}: quantization_config.ignore leaves {plain[0]!r} unquantized "
                        f"but quantizes {quantized[0]!r}; sv runs "
                        f"{'/'.join(m.rsplit('.', 1)[-1] for m in group)} of a layer as one "
                        "matrix, so they must be all FP8 or all left out"
                    )


def kv_scale_name(layer: int, which: str) -> str:
    """sv's name of layer `layer`'s K ("k_scale") or V ("v_scale") cache scale."""
    return f"model.layers.{layer}.self_attn.{which}"


def kv_scales_in(num_layers: int, infos: dict[str, TensorInfo], source: str) -> dict[str, str]:
    """The KV-cache scales among `infos`: sv's name -> the file's tensor, whichever spelling
    (module doc; a `kv_scale` is the tensor of both its layer's names). A WeightsError when a
    layer holds one scale under two names."""
    found: dict[str, str] = {}
    for layer in range(num_layers):
        for which, spellings in KV_SCALE_SPELLINGS.items():
            names = [f"model.layers.{layer}.self_attn.{spelling}" for spelling in spellings]
            present = [name for name in names if name in infos]
            if len(present) > 1:
                raise WeightsError(
                    f"{source}: tensors {present[0]!r} and {present[1]!r} are the same "
                    "KV-cache scale under two names; keep one"
                )
            if present:
                found[kv_scale_name(layer, which)] = present[0]
    return found


def read_quantization(model_dir: str | Path) -> FP8Quantization | None:
    """The FP8 scheme of `<model_dir>/config.json`, or None when it has no
    quantization_config. Raises WeightsError for a layout sv does not read."""
    path = Path(model_dir) / "config.json"
    raw = read_json_file(path, "config")
    if not isinstance(raw, dict) or raw.get("quantization_config") is None:
        return None
    return parse_quantization_config(raw["quantization_config"], str(path))


def parse_quantization_config(qc: Any, source: str) -> FP8Quantization:
    """Check a `quantization_config` object (see the module doc) and return its scheme."""
    where = f"{source}: quantization_config"
    if not isinstance(qc, dict):
        raise WeightsError(f"{where} must be an object")
    method = qc.get("quant_method")
    if method != QUANT_METHOD:
        raise WeightsError(
            f"{where}.quant_method is {method!r}; sv reads only {QUANT_METHOD!r} FP8 checkpoints"
        )
    groups = qc.get("config_groups")
    # No group (llm-compressor writes {}, other writers null or no key): no weight is
    # quantized, as when only the KV cache was calibrated (module doc).
    if groups is not None and (not isinstance(groups, dict) or len(groups) > 1):
        raise WeightsError(f"{where}.config_groups must hold one group (FP8 weights) or none")
    fmt = qc.get("format")
    if groups:
        if fmt not in _FORMATS:
            raise WeightsError(
                f"{where}.format is {fmt!r}; with config_groups sv reads only "
                f"{' or '.join(map(repr, _FORMATS))} (FP8 weights)"
            )
    elif fmt not in (DENSE_FORMAT, *_FORMATS):
        # Exporters name the format of plain weights "dense", or the one the checkpoint
        # would have with FP8 weights; either way no tensor of the file is compressed.
        raise WeightsError(
            f"{where}.format is {fmt!r}; without config_groups (plain weights) sv reads only "
            f"{', '.join(map(repr, (DENSE_FORMAT, *_FORMATS)))}"
        )
    strategy: Strategy | None = None
    if groups:
        ((group_name, group),) = groups.items()
        gwhere = f"{where}.config_groups.{group_name}"
        if not isinstance(group, dict):
            raise WeightsError(f"{gwhere} must be an object")
        targets = group.get("targets")
        if targets != ["Linear"]:
            raise WeightsError(f"{gwhere}.targets is {targets!r}; sv reads only ['Linear']")
        args = group.get("weights")
        found = _check_fp8_args(args, f"{gwhere}.weights", ("channel", "tensor"))
        strategy = "channel" if found == "channel" else "tensor"
        activations = group.get("input_activations")
        if activations is not None:
            _check_fp8_args(activations, f"{gwhere}.input_activations", ("token", "tensor"))
    ignore = qc.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(m, str) for m in ignore):
        raise WeightsError(f"{where}.ignore must be a list of module names")
    patterns = [m for m in ignore if m.startswith("re:")]
    if patterns and strategy is not None:  # without a group, ignore leaves out nothing
        raise WeightsError(f"{where}.ignore holds patterns ({patterns[0]!r}); sv reads only names")
    kv_scheme = qc.get("kv_cache_scheme")
    if kv_scheme is not None:
        _check_kv_cache_scheme(kv_scheme, f"{where}.kv_cache_scheme")
    # No group and no kv_cache_scheme: a config that quantizes nothing. vLLM runs such a
    # checkpoint unquantized (no linear layer matches a scheme), and so does sv: the scheme
    # quantizes no weight and declares no KV scales, so the checks refuse an FP8 tensor or a
    # KV-cache scale in the file naming quantization_config, and `--quantization auto`
    # treats the checkpoint as plain (sv_engine.options).
    return FP8Quantization(strategy, frozenset(ignore), kv_scheme is not None)


def _check_kv_cache_scheme(scheme: Any, where: str) -> None:
    """Refuse a KV cache scheme sv cannot honour: it uses one static FP8 scale per layer for
    K and one for V (module doc)."""
    _check_fp8_args(scheme, where, ("tensor",))
    if scheme.get("dynamic", False) is not False:
        raise WeightsError(
            f"{where}.dynamic is {scheme['dynamic']!r}; sv reads only false (calibrated scales "
            "in the checkpoint)"
        )


def _check_fp8_args(args: Any, where: str, strategies: tuple[str, ...]) -> str:
    if not isinstance(args, dict):
        raise WeightsError(f"{where} must be an object")
    wanted: dict[str, Any] = {"num_bits": 8, "type": "float"}
    for key, value in wanted.items():
        if args.get(key) != value:
            raise WeightsError(f"{where}.{key} is {args.get(key)!r}; sv reads only {value!r}")
    if args.get("symmetric", True) is not True:
        raise WeightsError(f"{where}.symmetric is {args.get('symmetric')!r}; sv reads only true")
    if args.get("group_size") is not None:
        raise WeightsError(f"{where}.group_size is {args['group_size']!r}; sv reads no groups")
    strategy = args.get("strategy")
    if strategy not in strategies:
        raise WeightsError(f"{where}.strategy is {strategy!r}; sv reads {' or '.join(strategies)}")
    return str(strategy)

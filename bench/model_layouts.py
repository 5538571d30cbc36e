#!/usr/bin/python3
"""Gradient layouts and backward compute profiles of real models, for the training-step
benchmark: every parameter tensor of the model in the order backward makes its gradient ready,
grouped by the layer whose backward finishes it, with that layer's backward time.

    /usr/bin/python3 bench/model_layouts.py MODEL [-o FILE] [--batch N] [--seq-len L]
        [--image-size P] [--gpu-tflops T] [--efficiency E]
    /usr/bin/python3 bench/model_layouts.py --list

MODEL: resnet50, vgg16 (torchvision's constructors, random weights, nothing downloaded),
bert-base, gpt2-small (built below from their published configurations with torch.nn modules,
parameter names as in Hugging Face's BertModel / GPT2LMHeadModel). Writes one JSON object to
FILE (stdout without -o). Needs torch (and torchvision for the CNNs): Debian's python3-torch
and python3-torchvision under /usr/bin/python3. bench/layouts/*.json are this script's output
at the defaults; tests/python/test_model_layouts.py checks they are current.

How the layout is obtained
  Backward order is measured: the model is built on the CPU, each parameter gets a tensor hook
  (Tensor.register_hook), one small forward and backward pass runs (batch 1, 64x64 image or
  8 tokens; the loss is the sum of the outputs' means), and the order in which the hooks fire
  is the order the autograd engine makes the gradients ready (the moment DDP's reducer sees
  them). A tied parameter (GPT-2's wte / lm_head) is one tensor, ready once both of its uses
  have been differentiated.
  Layers are the leaf modules that hold parameters, plus the attention core (QK^T, softmax,
  AV) of the transformers, in reverse forward order. A parameterless leaf module (activation,
  pooling, dropout) adds its FLOPs to the layer that ran just before it in forward order. A
  parameter belongs to the last layer in backward order that uses it. The generator checks
  that the layers' tensors, read in layer order, are exactly the measured order, and fails
  otherwise.

How the profile is obtained (scaled from FLOPs, not measured)
  Forward FLOPs per layer are counted by forward hooks while the model runs on the meta device
  (shapes only, no arithmetic) at the profile's batch and image size / sequence length:
    Conv2d      2 x output elements x in_channels / groups x kernel area, + output if bias
    Linear      2 x rows x in_features x out_features, + rows x out_features if bias
    attention   2 x B x heads x S x S x head_dim for QK^T and again for AV, + 5 per score
                (scale, mask, softmax)
    BatchNorm2d, LayerNorm  4 per element; ReLU, GELU, Tanh  1 per element
    MaxPool2d   kernel area per output element; AdaptiveAvgPool2d  1 per input element
    Embedding, Dropout  0; residual additions and reshapes (not modules) are not counted.
  Backward FLOPs = 2 x forward FLOPs; backward_ms = backward FLOPs / (gpu_tflops x 1e12 x
  efficiency). Defaults: gpu_tflops 67 (the FP32 peak of an H100 / H200 SXM without tensor
  cores: plain FP32 training; 495 is its dense TF32 tensor-core peak, 989 dense BF16) and
  efficiency 0.4. The defaults of batch and size are in DEFAULTS below.

Output schema (one JSON object):
  model         "resnet50" | "vgg16" | "bert-base" | "gpt2-small"
  source        what built it: "torchvision 0.14.1a0 resnet50()", or the configuration used
  parameters    total parameter count (tied parameters once)
  bytes         parameters x 4
  backward_order  how the order was obtained (a sentence)
  tensors       every parameter tensor, in backward order:
                {name, shape [..], dtype "float32", elements, bytes, backward_index, layer}
  layers        in backward order: {name, forward_flops, backward_flops, backward_ms,
                tensors [names, in the order they become ready]}; a layer may have no tensors
                (GPT-2's lm_head, whose weight is ready only after the embedding's backward;
                the attention cores)
  profile       {basis "scaled from FLOPs, not measured", batch, image_size | seq_len,
                gpu_tflops, efficiency, backward_flops_factor 2, forward_flops,
                backward_flops, backward_ms, flop_rules (the rules above, in words)}
"""

import argparse
import json
import math
import os
import sys

DEFAULTS = {
    "resnet50": {"batch": 32, "image_size": 224},
    "vgg16": {"batch": 32, "image_size": 224},
    "bert-base": {"batch": 32, "seq_len": 128},
    "gpt2-small": {"batch": 8, "seq_len": 1024},
}
MODELS = list(DEFAULTS)
DEFAULT_GPU_TFLOPS = 67.0
DEFAULT_EFFICIENCY = 0.4
BACKWARD_FLOPS_FACTOR = 2
FLOP_RULES = ("Conv2d 2 x output x in_channels/groups x kernel area (+ output if bias); "
              "Linear 2 x rows x in x out (+ rows x out if bias); attention 2 x B x heads x "
              "S x S x head_dim for QK^T and for AV + 5 per score; BatchNorm2d, LayerNorm 4 "
              "per element; ReLU, GELU, Tanh 1 per element; MaxPool2d kernel area per output; "
              "AdaptiveAvgPool2d 1 per input; Embedding, Dropout 0; residual additions not "
              "counted; parameterless modules charged to the layer before them in forward "
              "order; backward = 2 x forward")
BACKWARD_ORDER_METHOD = (
    "measured: Tensor.register_hook on every parameter, one CPU forward and backward pass "
    "(batch 1, %s, loss = sum of the outputs' means) under torch %s; the order the hooks fired")

# Published configurations (BERT: google-research/bert's bert_config.json for uncased_L-12_H-768
# _A-12, as in Hugging Face's bert-base-uncased; GPT-2: openai/gpt-2's hparams.json for 124M,
# as in Hugging Face's gpt2).
BERT_BASE = {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 30522,
             "positions": 512, "token_types": 2, "ln_eps": 1e-12}
GPT2_SMALL = {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 50257,
              "positions": 1024, "ln_eps": 1e-5}


class LayoutError(Exception):
    """A request the generator cannot serve (bad size, inconsistent layout)."""


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise LayoutError("torch is not importable from %s (%s); run under /usr/bin/python3 "
                          "with python3-torch installed" % (sys.executable, e)) from e
    return torch


def _transformer_modules(torch):
    """The torch.nn modules of BERT-base and GPT-2 small (defined here so that torch is only
    imported when a layout is generated)."""
    nn = torch.nn

    class AttentionCore(nn.Module):
        """softmax(Q K^T / sqrt(d) [+ causal mask]) V over [B, S, hidden] inputs; no
        parameters. Its FLOPs (both matmuls, 5 per score) are counted by the profile's hook."""

        def __init__(self, heads, causal):
            super().__init__()
            self.heads = heads
            self.causal = causal

        def forward(self, q, k, v):
            b, s, h = q.shape
            d = h // self.heads

            def split(t):
                return t.view(b, s, self.heads, d).permute(0, 2, 1, 3)

            scores = torch.matmul(split(q), split(k).transpose(-1, -2)) / math.sqrt(d)
            if self.causal:
                mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
                scores = scores.masked_fill(mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out = torch.matmul(probs, split(v))
            return out.permute(0, 2, 1, 3).reshape(b, s, h)

    class BertSelfAttention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.query = nn.Linear(c["hidden"], c["hidden"])
            self.key = nn.Linear(c["hidden"], c["hidden"])
            self.value = nn.Linear(c["hidden"], c["hidden"])
            self.core = AttentionCore(c["heads"], causal=False)
            self.dropout = nn.Dropout(0.1)

        def forward(self, x):
            return self.dropout(self.core(self.query(x), self.key(x), self.value(x)))

    class BertResidualOutput(nn.Module):
        """dense -> dropout -> LayerNorm(. + residual): BertSelfOutput and BertOutput."""

        def __init__(self, c, d_in):
            super().__init__()
            self.dense = nn.Linear(d_in, c["hidden"])
            self.LayerNorm = nn.LayerNorm(c["hidden"], eps=c["ln_eps"])
            self.dropout = nn.Dropout(0.1)

        def forward(self, x, residual):
            return self.LayerNorm(self.dropout(self.dense(x)) + residual)

    class BertAttention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.self = BertSelfAttention(c)
            self.output = BertResidualOutput(c, c["hidden"])

        def forward(self, x):
            return self.output(self.self(x), x)

    class BertIntermediate(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.dense = nn.Linear(c["hidden"], c["ffn"])
            self.intermediate_act_fn = nn.GELU()

        def forward(self, x):
            return self.intermediate_act_fn(self.dense(x))

    class BertLayer(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.attention = BertAttention(c)
            self.intermediate = BertIntermediate(c)
            self.output = BertResidualOutput(c, c["ffn"])

        def forward(self, x):
            a = self.attention(x)
            return self.output(self.intermediate(a), a)

    class BertEmbeddings(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.word_embeddings = nn.Embedding(c["vocab"], c["hidden"])
            self.position_embeddings = nn.Embedding(c["positions"], c["hidden"])
            self.token_type_embeddings = nn.Embedding(c["token_types"], c["hidden"])
            self.LayerNorm = nn.LayerNorm(c["hidden"], eps=c["ln_eps"])
            self.dropout = nn.Dropout(0.1)

        def forward(self, ids):
            s = ids.shape[1]
            pos = torch.arange(s, device=ids.device).unsqueeze(0)
            types = torch.zeros_like(ids)
            x = self.word_embeddings(ids) + self.token_type_embeddings(types)
            x = x + self.position_embeddings(pos)
            return self.dropout(self.LayerNorm(x))

    class BertEncoder(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.layer = nn.ModuleList([BertLayer(c) for _ in range(c["layers"])])

        def forward(self, x):
            for layer in self.layer:
                x = layer(x)
            return x

    class BertPooler(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.dense = nn.Linear(c["hidden"], c["hidden"])
            self.activation = nn.Tanh()

        def forward(self, x):
            return self.activation(self.dense(x[:, 0]))

    class BertModel(nn.Module):
        """Hugging Face's BertModel (with the pooler) at BERT_BASE; no attention mask."""

        def __init__(self, c):
            super().__init__()
            self.embeddings = BertEmbeddings(c)
            self.encoder = BertEncoder(c)
            self.pooler = BertPooler(c)

        def forward(self, ids):
            seq = self.encoder(self.embeddings(ids))
            return seq, self.pooler(seq)

    class GPT2Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.hidden = c["hidden"]
            self.c_attn = nn.Linear(c["hidden"], 3 * c["hidden"])
            self.core = AttentionCore(c["heads"], causal=True)
            self.c_proj = nn.Linear(c["hidden"], c["hidden"])
            self.resid_dropout = nn.Dropout(0.1)

        def forward(self, x):
            q, k, v = self.c_attn(x).split(self.hidden, dim=2)
            return self.resid_dropout(self.c_proj(self.core(q, k, v)))

    class GPT2MLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c_fc = nn.Linear(c["hidden"], c["ffn"])
            self.act = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(c["ffn"], c["hidden"])
            self.dropout = nn.Dropout(0.1)

        def forward(self, x):
            return self.dropout(self.c_proj(self.act(self.c_fc(x))))

    class GPT2Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.ln_1 = nn.LayerNorm(c["hidden"], eps=c["ln_eps"])
            self.attn = GPT2Attention(c)
            self.ln_2 = nn.LayerNorm(c["hidden"], eps=c["ln_eps"])
            self.mlp = GPT2MLP(c)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT2Model(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.wte = nn.Embedding(c["vocab"], c["hidden"])
            self.wpe = nn.Embedding(c["positions"], c["hidden"])
            self.drop = nn.Dropout(0.1)
            self.h = nn.ModuleList([GPT2Block(c) for _ in range(c["layers"])])
            self.ln_f = nn.LayerNorm(c["hidden"], eps=c["ln_eps"])

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            x = self.drop(self.wte(ids) + self.wpe(pos))
            for block in self.h:
                x = block(x)
            return self.ln_f(x)

    class GPT2LMHeadModel(nn.Module):
        """Hugging Face's GPT2LMHeadModel at GPT2_SMALL: lm_head (no bias) tied to wte."""

        def __init__(self, c):
            super().__init__()
            self.transformer = GPT2Model(c)
            self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)
            self.lm_head.weight = self.transformer.wte.weight

        def forward(self, ids):
            return self.lm_head(self.transformer(ids))

    return AttentionCore, BertModel, GPT2LMHeadModel


class _Spec:
    """One model: how to build it, its inputs, and what the output's `source` says."""

    def __init__(self, torch, name):
        self.torch = torch
        self.name = name
        if name in ("resnet50", "vgg16"):
            try:
                import torchvision
            except ImportError as e:
                raise LayoutError("torchvision is not importable from %s (%s); install "
                                  "python3-torchvision" % (sys.executable, e)) from e
            self.build = getattr(torchvision.models, name)  # weights=None: nothing downloaded
            self.source = "torchvision %s %s()" % (torchvision.__version__, name)
            self.order_input = "64x64 image"
            self.attention_core = None
        else:
            core, bert, gpt2 = _transformer_modules(torch)
            self.attention_core = core
            config = BERT_BASE if name == "bert-base" else GPT2_SMALL
            cls = bert if name == "bert-base" else gpt2
            self.config = config
            self.build = lambda: cls(config)
            self.source = ("torch.nn modules at the published configuration %s (%s)"
                           % (json.dumps(config, sort_keys=True),
                              "Hugging Face BertModel with pooler" if name == "bert-base"
                              else "Hugging Face GPT2LMHeadModel, lm_head tied to wte"))
            self.order_input = "8 tokens"

    def inputs(self, batch, size, device):
        torch = self.torch
        if self.attention_core is None:
            return torch.zeros(batch, 3, size, size, device=device)
        return torch.zeros(batch, size, dtype=torch.long, device=device)

    def check_size(self, size):
        if self.attention_core is None:
            if size < 32:
                raise LayoutError("--image-size %d: %s needs at least 32 (five stride-2 stages)"
                                  % (size, self.name))
        elif size > self.config["positions"]:
            raise LayoutError("--seq-len %d exceeds %s's %d positions"
                              % (size, self.name, self.config["positions"]))


def _loss(torch, out):
    outs = out if isinstance(out, tuple) else (out,)
    return sum(o.float().mean() for o in outs)


def _canonical_names(model):
    """id(parameter) -> its name in named_parameters() (a tied parameter: its first name)."""
    return {id(p): n for n, p in model.named_parameters()}


def _measure_backward_order(torch, spec, model):
    """The parameter names in the order their gradients become ready in one CPU backward."""
    names = _canonical_names(model)
    order, handles = [], []
    for p in model.parameters():  # each tied parameter once
        handles.append(p.register_hook(lambda g, n=names[id(p)]: order.append(n)))
    small = 64 if spec.attention_core is None else 8
    model.train()
    _loss(torch, model(spec.inputs(1, small, "cpu"))).backward()
    for h in handles:
        h.remove()
    if sorted(order) != sorted(names.values()) or len(order) != len(set(order)):
        missing = sorted(set(names.values()) - set(order))
        raise LayoutError("%s: the backward pass did not produce exactly one gradient per "
                          "parameter (missing: %s)" % (spec.name, missing[:5]))
    return order


def _module_flops(torch, spec, module, inputs, output):
    """Forward FLOPs of one leaf-module call (the rules in the file header)."""
    nn = torch.nn
    if spec.attention_core is not None and isinstance(module, spec.attention_core):
        b, s, h = inputs[0].shape
        scores = b * module.heads * s * s
        return 2 * 2 * scores * (h // module.heads) + 5 * scores
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        n = output.numel()
        return 2 * n * (module.in_channels // module.groups) * kh * kw + (
            n if module.bias is not None else 0)
    if isinstance(module, nn.Linear):
        rows = inputs[0].numel() // module.in_features
        return 2 * rows * module.in_features * module.out_features + (
            rows * module.out_features if module.bias is not None else 0)
    if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
        return 4 * output.numel()
    if isinstance(module, (nn.ReLU, nn.GELU, nn.Tanh)):
        return output.numel()
    if isinstance(module, nn.MaxPool2d):
        k = module.kernel_size
        area = k * k if isinstance(k, int) else k[0] * k[1]
        return area * output.numel()
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return inputs[0].numel()
    if isinstance(module, (nn.Embedding, nn.Dropout, nn.Identity, nn.Flatten)):
        return 0
    raise LayoutError("%s: no FLOP rule for module type %s" % (spec.name, type(module).__name__))


def _forward_calls(torch, spec, model, batch, size):
    """Leaf-module calls of one forward pass on the meta device at the profile's size, in
    call order: [(module name, module, forward FLOPs)]."""
    calls, handles = [], []
    leaves = [(n, m) for n, m in model.named_modules() if not list(m.children())]
    for name, module in leaves:
        def hook(mod, inp, out, name=name):
            calls.append((name, mod, _module_flops(torch, spec, mod, inp, out)))
        handles.append(module.register_forward_hook(hook))
    with torch.no_grad():
        model(spec.inputs(batch, size, "meta"))
    for h in handles:
        h.remove()
    return calls


def generate(name, batch=None, seq_len=None, image_size=None,
             gpu_tflops=DEFAULT_GPU_TFLOPS, efficiency=DEFAULT_EFFICIENCY):
    """The layout of MODEL `name` as a JSON-ready dict (the schema in the file header)."""
    if name not in DEFAULTS:
        raise LayoutError("unknown model %r; known: %s" % (name, ", ".join(MODELS)))
    cnn = "image_size" in DEFAULTS[name]
    if (seq_len is not None and cnn) or (image_size is not None and not cnn):
        raise LayoutError("%s takes %s, not %s" % (
            name, "--image-size" if cnn else "--seq-len", "--seq-len" if cnn else "--image-size"))
    batch = DEFAULTS[name]["batch"] if batch is None else batch
    size_key = "image_size" if cnn else "seq_len"
    size = (image_size if cnn else seq_len)
    size = DEFAULTS[name][size_key] if size is None else size
    if batch < 1 or size < 1:
        raise LayoutError("--batch and --%s must be positive (got %d, %d)"
                          % (size_key.replace("_", "-"), batch, size))
    if not (gpu_tflops > 0 and math.isfinite(gpu_tflops)):
        raise LayoutError("--gpu-tflops must be positive (got %r)" % gpu_tflops)
    if not 0 < efficiency <= 1:
        raise LayoutError("--efficiency must be in (0, 1] (got %r)" % efficiency)

    torch = _import_torch()
    spec = _Spec(torch, name)
    spec.check_size(size)
    torch.manual_seed(0)
    model = spec.build()
    names = _canonical_names(model)
    params = {names[id(p)]: p for p in model.parameters()}
    # Which canonical parameters each leaf module holds (lm_head holds wte's).
    holds = {n: [names[id(p)] for p in m.parameters(recurse=False)]
             for n, m in model.named_modules() if not list(m.children())}
    order = _measure_backward_order(torch, spec, model)
    meta = {n: (list(p.shape), p.dtype) for n, p in params.items()}
    total = sum(p.numel() for p in params.values())

    calls = _forward_calls(torch, spec, model.to("meta"), batch, size)
    # Layers in forward order: calls of modules holding parameters or the attention core; a
    # parameterless call adds its FLOPs to the layer before it.
    layers, seen = [], {}
    for mname, module, flops in calls:
        is_layer = holds[mname] or (spec.attention_core is not None
                                    and isinstance(module, spec.attention_core))
        if is_layer or not layers:
            seen[mname] = seen.get(mname, 0) + 1
            lname = mname if seen[mname] == 1 else "%s#%d" % (mname, seen[mname])
            layers.append({"name": lname, "module": mname, "forward_flops": flops,
                           "tensors": []})
        else:
            layers[-1]["forward_flops"] += flops
    layers.reverse()  # backward order
    # A parameter belongs to the last layer in backward order that uses it.
    owner = {}
    for i, layer in enumerate(layers):
        for p in holds[layer["module"]]:
            owner[p] = i
    position = {n: i for i, n in enumerate(order)}
    for p, i in sorted(owner.items(), key=lambda kv: position[kv[0]]):
        layers[i]["tensors"].append(p)
    flattened = [t for layer in layers for t in layer["tensors"]]
    if flattened != order:
        first = next(i for i, (a, b) in enumerate(zip(flattened + [None], order)) if a != b)
        raise LayoutError("%s: the layers' tensors in reverse forward order disagree with the "
                          "measured gradient order at position %d (%s vs %s)"
                          % (name, first, flattened[first] if first < len(flattened) else None,
                             order[first]))

    rate = gpu_tflops * 1e12 * efficiency
    layer_of = {t: layer["name"] for layer in layers for t in layer["tensors"]}
    tensors = []
    for i, n in enumerate(order):
        shape, dtype = meta[n]
        if dtype != torch.float32:
            raise LayoutError("%s: parameter %s is %s, expected float32" % (name, n, dtype))
        elements = math.prod(shape)
        tensors.append({"name": n, "shape": shape, "dtype": "float32", "elements": elements,
                        "bytes": 4 * elements, "backward_index": i, "layer": layer_of[n]})
    out_layers = []
    for layer in layers:
        bwd = BACKWARD_FLOPS_FACTOR * layer["forward_flops"]
        out_layers.append({"name": layer["name"], "forward_flops": layer["forward_flops"],
                           "backward_flops": bwd, "backward_ms": round(bwd / rate * 1e3, 6),
                           "tensors": layer["tensors"]})
    forward_flops = sum(layer["forward_flops"] for layer in layers)
    profile = {"basis": "scaled from FLOPs, not measured", "batch": batch, size_key: size,
               "gpu_tflops": gpu_tflops, "efficiency": efficiency,
               "backward_flops_factor": BACKWARD_FLOPS_FACTOR, "forward_flops": forward_flops,
               "backward_flops": BACKWARD_FLOPS_FACTOR * forward_flops,
               "backward_ms": round(BACKWARD_FLOPS_FACTOR * forward_flops / rate * 1e3, 6),
               "flop_rules": FLOP_RULES}
    return {"model": name, "source": spec.source, "parameters": total, "bytes": 4 * total,
            "backward_order": BACKWARD_ORDER_METHOD % (spec.order_input, torch.__version__),
            "tensors": tensors, "layers": out_layers, "profile": profile}


def to_json(layout):
    """The file text: one tensor or layer per line, so diffs stay readable."""
    lines = ["{"]
    keys = list(layout)
    for i, key in enumerate(keys):
        comma = "," if i + 1 < len(keys) else ""
        value = layout[key]
        if isinstance(value, list):
            lines.append(" %s: [" % json.dumps(key))
            for j, item in enumerate(value):
                lines.append("  %s%s" % (json.dumps(item), "," if j + 1 < len(value) else ""))
            lines.append(" ]%s" % comma)
        else:
            lines.append(" %s: %s%s" % (json.dumps(key), json.dumps(value), comma))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="one of: " + ", ".join(MODELS))
    ap.add_argument("--list", action="store_true", help="list the models and their defaults")
    ap.add_argument("-o", "--output", help="write the JSON here (default: stdout)")
    ap.add_argument("--batch", type=int, help="samples per step (default: per model)")
    ap.add_argument("--seq-len", type=int, help="tokens per sample (bert-base, gpt2-small)")
    ap.add_argument("--image-size", type=int, help="image side in pixels (resnet50, vgg16)")
    ap.add_argument("--gpu-tflops", type=float, default=DEFAULT_GPU_TFLOPS,
                    help="peak TFLOP/s the profile assumes (default %(default)s)")
    ap.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY,
                    help="fraction of the peak backward reaches (default %(default)s)")
    args = ap.parse_args(argv)
    if args.list:
        for m in MODELS:
            print(m, " ".join("%s=%s" % kv for kv in DEFAULTS[m].items()))
        return 0
    if args.model is None:
        ap.error("name a MODEL (or --list)")
    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        print("model_layouts: cannot write %s: its directory does not exist" % args.output,
              file=sys.stderr)
        return 2
    try:
        layout = generate(args.model, batch=args.batch, seq_len=args.seq_len,
                          image_size=args.image_size, gpu_tflops=args.gpu_tflops,
                          efficiency=args.efficiency)
    except LayoutError as e:
        print("model_layouts: %s" % e, file=sys.stderr)
        return 2
    text = to_json(layout)
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(text)
        except OSError as e:
            print("model_layouts: cannot write %s: %s" % (args.output, e.strerror),
                  file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

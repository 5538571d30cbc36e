"""bench/model_layouts.py: the gradient layouts and compute profiles of ResNet-50, VGG-16,
BERT-base and GPT-2 small, and the shipped bench/layouts/*.json files.

Checks parameter counts against torchvision's models and the published configurations, that
every parameter appears once in a backward order that starts at the model's last layer, the
FLOP counts against the known per-image / per-token figures, the profile's arithmetic, and that
the shipped files are what the generator produces now. Generating all four takes about 15 s
(module-scoped, once) and building the reference models about 5 s on the 2-core development
machine. Skips when torch (or, for the CNNs, torchvision) is not importable.
"""
import math
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
import model_layouts  # noqa: E402  (bench/model_layouts.py)

torch = pytest.importorskip("torch", reason="torch is not importable: the layouts need it "
                                            "(python3-torch under /usr/bin/python3)")

CNNS = ["resnet50", "vgg16"]
TRANSFORMERS = ["bert-base", "gpt2-small"]
# Published parameter counts: Hugging Face's BertModel (bert-base-uncased, with the pooler) and
# GPT2LMHeadModel (gpt2, lm_head tied to wte).
PUBLISHED = {"bert-base": 109482240, "gpt2-small": 124439808}
# The first tensors whose gradients become ready: the model's last layer.
FIRST_READY = {"resnet50": {"fc.weight", "fc.bias"},
               "vgg16": {"classifier.6.weight", "classifier.6.bias"},
               "bert-base": {"pooler.dense.weight", "pooler.dense.bias"},
               "gpt2-small": {"transformer.ln_f.weight", "transformer.ln_f.bias"}}


def _needs(model):
    if model in CNNS:
        pytest.importorskip("torchvision", reason="torchvision is not importable: the %s "
                                                  "layout needs python3-torchvision" % model)


@pytest.fixture(scope="module")
def layouts():
    cache = {}

    def get(model):
        _needs(model)
        if model not in cache:
            cache[model] = model_layouts.generate(model)
        return cache[model]

    return get


@pytest.fixture(scope="module")
def reference_params():
    """model -> {name: shape} of torchvision's model, or of the transformer as the generator
    builds it (its count is checked against the published one)."""
    cache = {}

    def get(model):
        if model not in cache:
            if model in CNNS:
                import torchvision
                built = getattr(torchvision.models, model)()
            else:
                built = model_layouts._Spec(torch, model).build()
            cache[model] = {n: list(p.shape) for n, p in built.named_parameters()}
        return cache[model]

    return get


@pytest.mark.parametrize("model", model_layouts.MODELS)
def test_shipped_file_is_what_the_generator_produces(layouts, model):
    path = os.path.join(REPO, "bench", "layouts", model + ".json")
    with open(path) as f:
        shipped = f.read()
    assert shipped == model_layouts.to_json(layouts(model)), (
        "%s is stale; regenerate it: /usr/bin/python3 bench/model_layouts.py %s -o %s"
        % (path, model, path))


@pytest.mark.parametrize("model", CNNS)
def test_parameter_count_equals_torchvisions(layouts, reference_params, model):
    layout = layouts(model)
    expected = sum(math.prod(shape) for shape in reference_params(model).values())
    assert layout["parameters"] == expected
    assert sum(t["elements"] for t in layout["tensors"]) == expected
    assert layout["bytes"] == 4 * expected


@pytest.mark.parametrize("model", TRANSFORMERS)
def test_parameter_count_equals_the_published_configuration(layouts, model):
    layout = layouts(model)
    assert layout["parameters"] == PUBLISHED[model]
    assert sum(t["elements"] for t in layout["tensors"]) == PUBLISHED[model]


def test_published_counts_follow_from_the_configurations():
    # Embeddings + layers x (QKV, output projection, FFN in and out, two LayerNorms) + the rest.
    def layer(c):
        h, f = c["hidden"], c["ffn"]
        return 3 * (h * h + h) + (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h

    b = model_layouts.BERT_BASE
    h = b["hidden"]
    bert = ((b["vocab"] + b["positions"] + b["token_types"]) * h + 2 * h
            + b["layers"] * layer(b) + h * h + h)  # + pooler
    g = model_layouts.GPT2_SMALL
    h = g["hidden"]
    gpt2 = (g["vocab"] + g["positions"]) * h + g["layers"] * layer(g) + 2 * h  # + ln_f
    assert (bert, gpt2) == (PUBLISHED["bert-base"], PUBLISHED["gpt2-small"])


@pytest.mark.parametrize("model", model_layouts.MODELS)
def test_every_parameter_appears_once_in_backward_order(layouts, reference_params, model):
    layout = layouts(model)
    reference = reference_params(model)  # tied parameters once
    names = [t["name"] for t in layout["tensors"]]
    assert sorted(names) == sorted(reference)
    assert len(set(names)) == len(names)
    for i, t in enumerate(layout["tensors"]):
        assert t["backward_index"] == i
        assert t["shape"] == reference[t["name"]]
        assert t["elements"] == math.prod(t["shape"])
        assert t["bytes"] == 4 * t["elements"] and t["dtype"] == "float32"
    # The layers, in backward order, hand over exactly the tensors in that order.
    assert [n for layer in layout["layers"] for n in layer["tensors"]] == names
    layer_of = {n: layer["name"] for layer in layout["layers"] for n in layer["tensors"]}
    assert all(t["layer"] == layer_of[t["name"]] for t in layout["tensors"])
    assert len({layer["name"] for layer in layout["layers"]}) == len(layout["layers"])


@pytest.mark.parametrize("model", model_layouts.MODELS)
def test_backward_order_starts_at_the_last_layer(layouts, model):
    layout = layouts(model)
    assert {t["name"] for t in layout["tensors"][:2]} == FIRST_READY[model]


def test_gpt2_tied_embedding_is_one_tensor_ready_last(layouts):
    layout = layouts("gpt2-small")
    names = [t["name"] for t in layout["tensors"]]
    assert "lm_head.weight" not in names
    # wte's gradient has two parts (lm_head and the embedding): ready after the embedding's.
    assert names[-1] == "transformer.wte.weight"
    assert layout["layers"][0]["name"] == "lm_head" and layout["layers"][0]["tensors"] == []


@pytest.mark.parametrize("model,gmacs", [("resnet50", 4.1), ("vgg16", 15.5)])
def test_cnn_forward_flops_match_the_known_gmacs_per_image(layouts, model, gmacs):
    p = layouts(model)["profile"]
    assert (p["batch"], p["image_size"]) == (32, 224)
    per_image_gmacs = p["forward_flops"] / p["batch"] / 2 / 1e9
    assert per_image_gmacs == pytest.approx(gmacs, rel=0.05)


@pytest.mark.parametrize("model", TRANSFORMERS)
def test_transformer_forward_flops_are_2_params_tokens_plus_attention(layouts, model):
    # 2 x (parameters used in matmuls) x tokens + 4 x B x layers x S^2 x hidden for QK^T and AV,
    # within 1 % (norms, activations, softmax and biases are the rest). BERT's matmul
    # parameters exclude the embedding tables; GPT-2's keep wte (it is the LM head) and drop wpe.
    layout = layouts(model)
    p = layout["profile"]
    b, s = p["batch"], p["seq_len"]
    c = model_layouts.BERT_BASE if model == "bert-base" else model_layouts.GPT2_SMALL
    by_name = {t["name"]: t["elements"] for t in layout["tensors"]}
    embedding = sum(n for name, n in by_name.items() if "embeddings" in name)
    matmul = layout["parameters"] - (embedding if model == "bert-base"
                                     else by_name["transformer.wpe.weight"])
    expected = 2 * matmul * b * s + 4 * b * c["layers"] * s * s * c["hidden"]
    assert p["forward_flops"] == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("model", model_layouts.MODELS)
def test_profile_is_backward_flops_over_the_stated_rate(layouts, model):
    layout = layouts(model)
    p = layout["profile"]
    assert p["basis"] == "scaled from FLOPs, not measured"
    assert (p["gpu_tflops"], p["efficiency"], p["backward_flops_factor"]) == (67.0, 0.4, 2)
    rate = 67e12 * 0.4
    for layer in layout["layers"]:
        assert layer["backward_flops"] == 2 * layer["forward_flops"]
        assert layer["backward_ms"] == round(layer["backward_flops"] / rate * 1e3, 6)
    assert p["forward_flops"] == sum(layer["forward_flops"] for layer in layout["layers"])
    assert p["backward_ms"] == pytest.approx(sum(layer["backward_ms"]
                                                 for layer in layout["layers"]), abs=1e-3)


@pytest.mark.parametrize("argv,message", [
    (["nosuch"], "unknown model 'nosuch'"),
    (["gpt2-small", "--seq-len", "2048"], "exceeds gpt2-small's 1024 positions"),
    (["bert-base", "--image-size", "224"], "bert-base takes --seq-len"),
    (["resnet50", "--batch", "0"], "must be positive"),
    (["resnet50", "--image-size", "16"], "needs at least 32"),
    (["vgg16", "--efficiency", "1.5"], "--efficiency must be in (0, 1]"),
])
def test_bad_requests_name_the_problem(capsys, argv, message):
    if argv[0] in CNNS:
        _needs(argv[0])
    assert model_layouts.main(argv) == 2
    assert message in capsys.readouterr().err


def test_list_names_every_model_with_its_defaults(capsys):
    assert model_layouts.main(["--list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "resnet50 batch=32 image_size=224", "vgg16 batch=32 image_size=224",
        "bert-base batch=32 seq_len=128", "gpt2-small batch=8 seq_len=1024"]


def test_cli_writes_the_layout_and_names_an_unwritable_file(layouts, tmp_path, capsys):
    expected = model_layouts.to_json(layouts("resnet50"))
    out = tmp_path / "resnet50.json"
    assert model_layouts.main(["resnet50", "-o", str(out)]) == 0
    assert out.read_text() == expected
    bad = tmp_path / "missing" / "x.json"
    assert model_layouts.main(["resnet50", "-o", str(bad)]) == 2
    assert "cannot write %s" % bad in capsys.readouterr().err

"""Model signals against what the model itself computes: attention weights, logits, activations."""

from __future__ import annotations

import math

import torch

from trainhealth._internal import catalog
from trainhealth._internal.demo.tiny_gpt import TinyGPT, synthetic_batch
from trainhealth._internal.exporters.monitor import Monitor
from trainhealth._internal.exporters.training.model_signals import ModelSignals


def test_attention_max_logit_and_entropy_match_the_materialised_probabilities():
    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(3, 10, 16)
    mask = torch.ones(10, 10, dtype=torch.bool).triu(1)
    signals = ModelSignals(torch, attention, blocks=[], sample_tokens=10)
    signals.sampling = True
    _, weights = attention(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)
    tensors, order = signals.take()
    read = {name: float(tensor) for name, tensor, _ in tensors}
    values = ModelSignals.interpret(read, order)

    probabilities = weights[0].detach()  # (heads, tokens, keys) of the first sequence
    entropy = -(probabilities * probabilities.clamp_min(1e-30).log()).sum(-1).mean().item()
    assert math.isclose(values.attention_entropy["model"], entropy, rel_tol=1e-4)
    # recompute the logits from the projections by hand: the largest unmasked q.k/sqrt(d)
    w_q, w_k = attention.in_proj_weight[:16], attention.in_proj_weight[16:32]
    b_q, b_k = attention.in_proj_bias[:16], attention.in_proj_bias[16:32]
    q = (x[0] @ w_q.T + b_q).reshape(10, 2, 8).transpose(0, 1)
    k = (x[0] @ w_k.T + b_k).reshape(10, 2, 8).transpose(0, 1)
    logits = (q @ k.transpose(1, 2) / math.sqrt(8)).masked_fill(mask, -math.inf)
    assert math.isclose(values.attention_max_logit["model"], logits.max().item(), rel_tol=1e-5)


def test_pytorchs_own_transformer_encoder_is_read_from_the_inputs_its_layers_give_their_attention():
    # nn.TransformerEncoder calls each layer's self_attn with need_weights=False and the canonical causal mask:
    # the signals are recomputed from those inputs and must equal the probabilities attention would return
    torch.manual_seed(4)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(10)
    inputs: dict[int, torch.Tensor] = {}
    for index, block in enumerate(encoder.layers):
        block.self_attn.register_forward_pre_hook(lambda m, args, i=index: inputs.update({i: args[0].detach()}))
    signals = ModelSignals(torch, encoder, blocks=["layers.0", "layers.1"], sample_tokens=10)
    signals.sampling = True
    encoder(torch.randn(3, 10, 16), mask=mask, is_causal=True).sum().backward()
    tensors, order = signals.take()
    values = ModelSignals.interpret({name: float(t) if n == 1 else t.tolist() for name, t, n in tensors}, order)
    for index, block in enumerate(encoder.layers):
        attention, x = block.self_attn, inputs[index]
        with torch.no_grad():
            _, weights = attention(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)
        probabilities = weights[0]
        entropy = -(probabilities * probabilities.clamp_min(1e-30).log()).sum(-1).mean().item()
        assert math.isclose(values.attention_entropy[f"layers.{index}.self_attn"], entropy, rel_tol=1e-4)
        # the largest logit is where the probabilities say it is: log p + log Z of its row
        scale = math.sqrt(8)
        w_q, w_k = attention.in_proj_weight[:16], attention.in_proj_weight[16:32]
        b_q, b_k = attention.in_proj_bias[:16], attention.in_proj_bias[16:32]
        q = (x[0] @ w_q.T + b_q).reshape(10, 2, 8).transpose(0, 1)
        k = (x[0] @ w_k.T + b_k).reshape(10, 2, 8).transpose(0, 1)
        logits = (q @ k.transpose(1, 2) / scale + mask).detach()
        assert torch.allclose(torch.softmax(logits, -1), probabilities, atol=1e-5)  # the same logits attention used
        assert math.isclose(values.attention_max_logit[f"layers.{index}.self_attn"], logits.max().item(), rel_tol=1e-5)


def test_log_z_and_activation_rms_are_those_of_the_tensors():
    torch.manual_seed(1)
    model = TinyGPT(vocab=32, width=16, layers=2, heads=2, context=8)
    signals = ModelSignals(torch, model, blocks=["layers.0", "layers.1"], sample_tokens=8)
    signals.sampling = True
    captured = {}
    model.layers[1].register_forward_hook(lambda m, i, o: captured.setdefault("block", o.detach()))
    logits = model(synthetic_batch(32, 8, batch=2, seed=0)[:, :-1])
    tensors, order = signals.take()
    values = ModelSignals.interpret(
        {name: float(t) if length == 1 else t.tolist() for name, t, length in tensors}, order
    )
    assert math.isclose(values.log_z, torch.logsumexp(logits[0], -1).mean().item(), rel_tol=1e-5)
    assert math.isclose(values.activation_rms["layers.1"], captured["block"].pow(2).mean().sqrt().item(), rel_tol=1e-5)
    assert values.nonfinite_origin is None and order.forward == ("embed", "layers.0", "layers.1")  # never the head


def test_the_monitor_exports_the_signals_and_names_the_block_that_first_went_non_finite():
    torch.manual_seed(2)
    model = TinyGPT(vocab=32, width=16, layers=3, heads=2, context=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    poison = {"on": False}
    model.layers[1].mlp.register_forward_hook(lambda m, i, o: o * math.nan if poison["on"] else None)
    with Monitor(model, optimizer, prometheus=False, otel=False, gpu_backend="off", stats_every=2, env={}) as mon:
        for step in range(6):
            poison["on"] = step == 4
            loss = model.loss(synthetic_batch(32, 8, batch=4, seed=step))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            mon.step(loss=loss, step=step)
        mon.flush()
        store = mon.store
        layers = {labels[0] for labels, _ in store.series(catalog.MODEL_ATTENTION_ENTROPY)}
        assert layers == {"layers.0.attn", "layers.1.attn", "layers.2.attn"}
        assert {labels[0] for labels, _ in store.series(catalog.MODEL_ACTIVATION_RMS)} == {
            "layers.0",
            "layers.1",
            "layers.2",
        }
        assert store.value(catalog.MODEL_OUTPUT_LOG_Z) is not None
        # the NaN came out of layers.1 at step 4; step 5 starts from NaN weights, so its origin is upstream
        assert store.value(catalog.TRAIN_NONFINITE_ORIGIN, ("layers.1",)) == 1.0
        assert store.value(catalog.TRAIN_NONFINITE_FIRST_STEP, ("local",)) == 4.0
        event = mon.events.recent("nonfinite_origin")[0]
        assert event.attributes == {"block": "layers.1", "step": 4, "where": "local", "stage": "output"}


class _TorchWithoutLogsumexp:
    """torch, except that ``logsumexp`` raises, as an output type the head's hook cannot read makes it."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    def logsumexp(self, *args, **kwargs):
        raise RuntimeError("logsumexp: unsupported output")


def test_a_signal_whose_hook_raises_is_counted_once_and_turned_off_alone():
    from trainhealth._internal.store import MetricStore

    torch.manual_seed(1)
    model = TinyGPT(vocab=32, width=16, layers=2, heads=2, context=8)
    store = MetricStore()
    signals = ModelSignals(
        _TorchWithoutLogsumexp(), model, blocks=["layers.0", "layers.1"], sample_tokens=8, store=store
    )
    for seed in range(3):
        signals.sampling = True
        model(synthetic_batch(32, 8, batch=2, seed=seed)[:, :-1])  # never raises into the forward pass
        tensors, _ = signals.take()
        names = {name for name, _, _ in tensors}
        assert "log_z" not in names and {"activation_rms/layers.0", "activation_rms/layers.1"} <= names
    assert store.value(catalog.EXPORTER_ERRORS, ("model_signals",)) == 1.0  # once: then that signal is off

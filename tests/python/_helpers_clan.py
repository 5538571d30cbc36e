"""Helpers of the issue-6 optimizer tests (test_optimizer.py, test_convergence.py,
test_examples.py): a reference LANS written with plain torch ops, and small runners that start
worker processes against a bitpush.testing.LocalCluster.

The reference follows paper 001 Algorithm 2 in its simultaneous form (every norm taken with
the x from before the update) with the same switches as optimizers/lans.h: ε inside or
outside the square root, MXNet's gradient normalisation, and the trust-ratio fallback.
"""

import math

import torch


def reference_lans_step(x, m, v, g, step, lr, beta1=0.9, beta2=0.999, eps=1e-6,
                        weight_decay=0.0, eps_inside_sqrt=False, normalize_grad=False,
                        trust_ratio_fallback=True, phi_lower=0.0, phi_upper=math.inf):
    """One LANS update of one block, in place on x, m, v (all torch tensors of one shape)."""
    g = g.clone()
    if normalize_grad:
        gn = g.norm()
        if gn > 0:
            g = g / gn
    m.mul_(beta1).add_(g, alpha=1.0 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    m_hat = m / (1.0 - beta1 ** step)
    v_hat = v / (1.0 - beta2 ** step)
    den = (v_hat + eps).sqrt() if eps_inside_sqrt else v_hat.sqrt() + eps
    r = m_hat / den
    c = g / den
    phi = min(max(x.norm().item(), phi_lower), phi_upper)

    def trust(u):
        norm = u.norm().item()
        ratio = phi / norm if norm > 0 else math.inf
        if ratio == 0.0 or not math.isfinite(ratio):
            # fallback: 1 (MXNet / LAMB); without it the term is dropped (never NaN).
            ratio = 1.0 if trust_ratio_fallback else 0.0
        return ratio

    ur = r + weight_decay * x
    uc = c + weight_decay * x
    update = beta1 * trust(ur) * ur + (1.0 - beta1) * trust(uc) * uc
    x.sub_(lr * update)


class ReferenceLANS:
    """Reference LANS over a list of tensors (one block per tensor)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, **kw):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.wd, self.kw = lr, betas, eps, weight_decay, kw
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self, grads):
        self.t += 1
        for x, m, v, g in zip(self.params, self.m, self.v, grads):
            reference_lans_step(x, m, v, g, self.t, self.lr, self.betas[0], self.betas[1],
                                self.eps, self.wd, **self.kw)

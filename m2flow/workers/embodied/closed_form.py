"""The PPO minibatch gradient of an MLP actor-critic in closed form, without autograd.

For the policies embodied RL uses most (MLP trunks, Gaussian or categorical actions) the gradient
of the PPO loss is short to write by hand, and computing it directly costs about half of what
autograd's forward + backward costs on CPU, where a minibatch step is bound by the number of
tensor operations rather than by arithmetic. Gradients are written straight into the parameters'
``.grad`` tensors (views of the flat buffer), so nothing is accumulated afterwards.

It computes the gradient of exactly the loss of ``PPOUpdater._step_loss``; the tests compare the
two on every supported shape. Anything else (value clipping, a categorical entropy bonus, CNN
encoders, other activations) goes through autograd.

Derivatives used, per sample (z = (a - mu) / sigma, r = exp(log-ratio), A' = -A * scale)::

    d log-ratio / d mu        = z / sigma
    d log-ratio / d log sigma = z^2 - 1
    d log-ratio / d logits    = onehot(a) - softmax(logits)
    d pg / d r                = A' where A' r >= A' clip(r) (the unclipped term is the max), else 0
    d value-loss / d V        = 2 * vf_coef * scale * (V - R)
    tanh' = 1 - h^2, relu' = [h > 0]
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from m2flow.models.policies import ActorCritic, CategoricalHead, GaussianHead, MLPEncoder
from m2flow.workers.embodied.config import PPOConfig

_DERIVATIVES = {nn.Tanh: "tanh", nn.ReLU: "relu"}

Layer = tuple[nn.Linear, str]


def _mlp(trunk: nn.Module | None) -> list[Layer] | None:
    if not isinstance(trunk, MLPEncoder):
        return None
    modules = [m for m in trunk.net if not isinstance(m, nn.Flatten)]
    pairs = list(zip(modules[0::2], modules[1::2]))
    if len(pairs) * 2 != len(modules):
        return None
    out = []
    for linear, act in pairs:
        if not isinstance(linear, nn.Linear) or type(act) not in _DERIVATIVES:
            return None
        out.append((linear, _DERIVATIVES[type(act)]))
    return out


def supports(policy: ActorCritic, cfg: PPOConfig) -> bool:
    """Whether :class:`ClosedFormPPO` covers this policy and these settings."""
    if cfg.value_clip is not None:
        return False
    if _mlp(policy.actor_trunk) is None:
        return False
    if policy.critic_trunk is not None and _mlp(policy.critic_trunk) is None:
        return False
    if isinstance(policy.head, CategoricalHead):
        return not cfg.ent_coef
    return isinstance(policy.head, GaussianHead)


# Arithmetic with a Python float wraps it into a tensor and converts it (four extra dispatches);
# the hot path below uses 0-dim tensors made once instead.


def _forward(layers: list[Layer], x: Tensor) -> list[Tensor]:
    """Activations of every layer, input first: [x, h1, ..., hL]."""
    hs = [x]
    for linear, act in layers:
        pre = torch.addmm(linear.bias, hs[-1], linear.weight.t())
        hs.append(torch.tanh(pre) if act == "tanh" else torch.relu(pre))
    return hs


def _backward(layers: list[Layer], hs: list[Tensor], grad: Tensor, one: Tensor) -> None:
    """Write the weight and bias gradients of ``layers`` given d loss / d (last activation)."""
    for i in range(len(layers) - 1, -1, -1):
        linear, act = layers[i]
        h = hs[i + 1]
        if act == "tanh":
            grad = grad * torch.addcmul(one, h, h, value=-1.0)  # 1 - h^2
        else:
            grad = torch.where(h > 0, grad, one - one)
        torch.mm(grad.t(), hs[i], out=linear.weight.grad)
        torch.sum(grad, 0, out=linear.bias.grad)
        if i:
            grad = torch.mm(grad, linear.weight)


class ClosedFormPPO:
    """Loss parts and gradients of one minibatch share, for a policy :func:`supports` accepts."""

    def __init__(self, policy: ActorCritic, cfg: PPOConfig) -> None:
        if not supports(policy, cfg):
            raise ValueError("this policy or config needs autograd")
        self.policy = policy
        self.cfg = cfg
        self.actor = _mlp(policy.actor_trunk)
        self.critic = _mlp(policy.critic_trunk) if policy.critic_trunk is not None else None
        self.gaussian = isinstance(policy.head, GaussianHead)
        dtype = next(policy.parameters()).dtype
        device = next(policy.parameters()).device
        self._one = torch.ones((), dtype=dtype, device=device)
        self._zero = torch.zeros((), dtype=dtype, device=device)
        self._low = torch.full((), 1.0 - cfg.clip, dtype=dtype, device=device)
        self._high = torch.full((), 1.0 + cfg.clip, dtype=dtype, device=device)
        self._value_scale: dict[float, Tensor] = {}

    def to(self, device: torch.device | str) -> None:
        """Move the cached constants along with the policy."""
        for name in ("_one", "_zero", "_low", "_high"):
            setattr(self, name, getattr(self, name).to(device))
        self._value_scale = {}

    @torch.no_grad()
    def step(self, obs: Tensor, actions: Tensor, offset: Tensor, neg_adv: Tensor, returns: Tensor,
             scale: float) -> Tensor:
        """Write d loss / d parameters into every ``.grad``; returns the metric parts (see ``_step_loss``)."""
        cfg, policy, head = self.cfg, self.policy, self.policy.head
        x = obs.flatten(1) if obs.dim() > 2 else obs
        hs = _forward(self.actor, x)
        features = hs[-1]
        # log-ratio and d log-ratio / d (head output)
        if self.gaussian:
            mean = torch.addmm(head.mean.bias, features, head.mean.weight.t())
            inv_std = torch.exp(-head.log_std)
            z = (actions - mean) * inv_std
            zz = z * z
            log_ratio = torch.sub(offset - head.log_std.sum(), zz.sum(-1), alpha=0.5)
        else:
            logits = torch.addmm(head.logits.bias, features, head.logits.weight.t())
            log_p = torch.log_softmax(logits, dim=-1)
            log_ratio = log_p.gather(-1, actions).squeeze(-1) + offset
        ratio = torch.exp(log_ratio)
        clipped = torch.clamp(ratio, self._low, self._high)
        unclipped_term, clipped_term = neg_adv * ratio, neg_adv * clipped
        active = unclipped_term >= clipped_term
        pg = torch.where(active, unclipped_term, clipped_term).sum()
        d_log_ratio = torch.where(active, unclipped_term, self._zero).unsqueeze(-1)  # A' r where active
        if self.gaussian:
            d_out = d_log_ratio * z * inv_std  # d loss / d mean
            torch.sum(d_log_ratio * (zz - self._one), 0, out=head.log_std.grad)
            if cfg.ent_coef:  # entropy = n * (sum log_std + const): a constant slope per dimension
                head.log_std.grad.sub_(cfg.ent_coef * scale * x.shape[0])
            out_layer = head.mean
        else:
            d_out = -torch.exp(log_p) * d_log_ratio  # d loss / d logits
            d_out.scatter_add_(1, actions, d_log_ratio)
            out_layer = head.logits
        torch.mm(d_out.t(), features, out=out_layer.weight.grad)
        torch.sum(d_out, 0, out=out_layer.bias.grad)
        d_features = torch.mm(d_out, out_layer.weight)
        # the critic
        if self.critic is None:
            critic_hs, critic_features = hs, features
        else:
            critic_hs = _forward(self.critic, x)
            critic_features = critic_hs[-1]
        vh = policy.value_head
        values = torch.addmm(vh.bias, critic_features, vh.weight.t()).squeeze(-1)
        error = values - returns
        sq = torch.dot(error, error)
        if cfg.use_critic:
            factor = self._value_scale.get(scale)
            if factor is None:
                factor = self._value_scale[scale] = torch.full((), 2.0 * cfg.vf_coef * scale,
                                                               dtype=error.dtype, device=error.device)
            d_values = (error * factor).unsqueeze(-1)
        else:
            d_values = torch.zeros_like(error).unsqueeze(-1)
        torch.mm(d_values.t(), critic_features, out=vh.weight.grad)
        torch.sum(d_values, 0, out=vh.bias.grad)
        d_critic = torch.mm(d_values, vh.weight)
        if self.critic is None:
            _backward(self.actor, hs, d_features + d_critic, self._one)
        else:
            _backward(self.actor, hs, d_features, self._one)
            _backward(self.critic, critic_hs, d_critic, self._one)
        if not cfg.use_critic:
            sq = self._zero
        clipped_count = (clipped != ratio).sum(dtype=ratio.dtype)
        return torch.stack((pg, sq, ratio.sum(), log_ratio.sum(), clipped_count))

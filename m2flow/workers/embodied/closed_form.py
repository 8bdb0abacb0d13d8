"""The PPO minibatch gradient of an MLP actor-critic in closed form, without autograd.

For the policies embodied RL uses most (MLP trunks, Gaussian or categorical actions) the gradient
of the PPO loss is short to write by hand, and computing it directly costs about half of what
autograd's forward + backward costs on CPU, where a minibatch step is bound by the number of
tensor operations rather than by arithmetic. Gradients are written straight into the parameters'
``.grad`` tensors (views of the flat buffer), so nothing is accumulated afterwards.

It computes the gradient of exactly the loss of ``m2flow.algorithms.minibatch_ppo.ppo_minibatch_loss``
(which ``PPOUpdater._step_loss`` minimises through autograd); the tests compare it with autograd of
that definition on every supported shape. Anything else (value clipping, CNN encoders, other
activations) goes through autograd.

Derivatives used, per sample (z = (a - mu) / sigma, r = exp(log-ratio), A' = -A * scale)::

    d log-ratio / d mu        = z / sigma
    d log-ratio / d log sigma = z^2 - 1
    d log-ratio / d logits    = onehot(a) - softmax(logits)
    d entropy / d logits      = -p * (log p + H), p = softmax(logits), H = -sum p log p
    d entropy / d log sigma   = 1 (per action dimension)
    d pg / d r                = A' where A' r >= A' clip(r) (the unclipped term is the max), else 0
    d value-loss / d V        = 2 * vf_coef * scale * (V - R)
    tanh' = 1 - h^2, relu' = [h > 0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

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
    if not isinstance(policy, ActorCritic) or cfg.value_clip is not None:
        return False
    if _mlp(policy.actor_trunk) is None:
        return False
    if policy.critic_trunk is not None and _mlp(policy.critic_trunk) is None:
        return False
    return isinstance(policy.head, (CategoricalHead, GaussianHead))


# Arithmetic with a Python float wraps it into a tensor and converts it (four extra dispatches);
# the hot path below uses 0-dim tensors made once instead.


class Constants(NamedTuple):
    """0-dim tensors the step uses: 1, 0 and the ratio's clip bounds."""

    one: Tensor
    zero: Tensor
    low: Tensor
    high: Tensor


@dataclass(frozen=True)
class Net:
    """Where each tensor of an MLP actor-critic sits in its list of parameters (``FlatParameters.params``)."""

    actor: tuple[tuple[int, int, str], ...]
    """(weight, bias, activation) of each actor trunk layer."""
    critic: tuple[tuple[int, int, str], ...] | None
    """the same for the critic trunk; None: the critic reads the actor's features."""
    head: tuple[int, int]
    """(weight, bias) of the Gaussian mean or of the categorical logits."""
    log_std: int | None
    """the Gaussian log-std; None for a categorical head."""
    value: tuple[int, int]
    """(weight, bias) of the value head."""
    use_critic: bool

    @staticmethod
    def of(policy: ActorCritic, params: list[Tensor], cfg: PPOConfig) -> Net:
        index = {id(p): i for i, p in enumerate(params)}

        def layers(trunk: nn.Module) -> tuple[tuple[int, int, str], ...]:
            return tuple((index[id(lin.weight)], index[id(lin.bias)], act) for lin, act in _mlp(trunk) or [])

        head = policy.head
        gaussian = isinstance(head, GaussianHead)
        out = head.mean if gaussian else head.logits
        return Net(
            actor=layers(policy.actor_trunk),
            critic=None if policy.critic_trunk is None else layers(policy.critic_trunk),
            head=(index[id(out.weight)], index[id(out.bias)]),
            log_std=index[id(head.log_std)] if gaussian else None,
            value=(index[id(policy.value_head.weight)], index[id(policy.value_head.bias)]),
            use_critic=cfg.use_critic,
        )


class GradSink:
    """Writes each gradient into its tensor of ``.grad`` views (``out=``: nothing allocated)."""

    def __init__(self, grads: list[Tensor]) -> None:
        self.grads = grads

    def mm(self, i: int, a: Tensor, b: Tensor) -> None:
        torch.mm(a, b, out=self.grads[i])

    def sum0(self, i: int, x: Tensor) -> None:
        torch.sum(x, 0, out=self.grads[i])

    def sub(self, i: int, value: float) -> None:
        self.grads[i].sub_(value)


class GradList(GradSink):
    """Collects each gradient as a new tensor, for code that must not write into its inputs (compiled)."""

    def __init__(self, n: int) -> None:
        super().__init__([None] * n)  # type: ignore[list-item]

    def mm(self, i: int, a: Tensor, b: Tensor) -> None:
        self.grads[i] = torch.mm(a, b)

    def sum0(self, i: int, x: Tensor) -> None:
        self.grads[i] = torch.sum(x, 0)

    def sub(self, i: int, value: float) -> None:
        self.grads[i] = self.grads[i] - value


def _forward(layers: tuple[tuple[int, int, str], ...], p: list[Tensor], x: Tensor) -> list[Tensor]:
    """Activations of every layer, input first: [x, h1, ..., hL]."""
    hs = [x]
    for w, b, act in layers:
        pre = torch.addmm(p[b], hs[-1], p[w].t())
        hs.append(torch.tanh(pre) if act == "tanh" else torch.relu(pre))
    return hs


def _backward(layers: tuple[tuple[int, int, str], ...], p: list[Tensor], hs: list[Tensor], grad: Tensor,
              sink: GradSink, one: Tensor) -> None:
    """Write the weight and bias gradients of ``layers`` given d loss / d (last activation)."""
    for i in range(len(layers) - 1, -1, -1):
        w, b, act = layers[i]
        h = hs[i + 1]
        if act == "tanh":
            grad = grad * torch.addcmul(one, h, h, value=-1.0)  # 1 - h^2
        else:
            grad = torch.where(h > 0, grad, one - one)
        sink.mm(w, grad.t(), hs[i])
        sink.sum0(b, grad)
        if i:
            grad = torch.mm(grad, p[w])


def minibatch_gradient(net: Net, p: list[Tensor], sink: GradSink, k: Constants, obs: Tensor, actions: Tensor,
                       offset: Tensor, neg_adv: Tensor, returns: Tensor, value_factor: Tensor,
                       entropy_slope: float) -> Tensor:
    """Hand every parameter's d loss / d p to ``sink``; returns the metric parts (see ``PPOUpdater._step_loss``).

    ``p`` are the parameters in ``net``'s order, ``value_factor`` is 2 * vf_coef * scale and
    ``entropy_slope`` the entropy bonus's weight: for a Gaussian ent_coef * scale * (samples), the
    constant slope of the summed entropy in each log-std, for a categorical ent_coef * scale.
    """
    x = obs.flatten(1) if obs.dim() > 2 else obs
    hs = _forward(net.actor, p, x)
    features = hs[-1]
    w_out, b_out = net.head
    # log-ratio and d log-ratio / d (head output)
    if net.log_std is not None:
        log_std = p[net.log_std]
        mean = torch.addmm(p[b_out], features, p[w_out].t())
        inv_std = torch.exp(-log_std)
        z = (actions - mean) * inv_std
        zz = z * z
        log_ratio = torch.sub(offset - log_std.sum(), zz.sum(-1), alpha=0.5)
    else:
        logits = torch.addmm(p[b_out], features, p[w_out].t())
        log_p = torch.log_softmax(logits, dim=-1)
        log_ratio = log_p.gather(-1, actions).squeeze(-1) + offset
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, k.low, k.high)
    unclipped_term, clipped_term = neg_adv * ratio, neg_adv * clipped
    active = unclipped_term >= clipped_term
    pg = torch.where(active, unclipped_term, clipped_term).sum()
    d_log_ratio = torch.where(active, unclipped_term, k.zero).unsqueeze(-1)  # A' r where active
    if net.log_std is not None:
        d_out = d_log_ratio * z * inv_std  # d loss / d mean
        sink.sum0(net.log_std, d_log_ratio * (zz - k.one))
        if entropy_slope:  # entropy = n * (sum log_std + const): a constant slope per dimension
            sink.sub(net.log_std, entropy_slope)
    else:
        probs = torch.exp(log_p)
        d_out = -probs * d_log_ratio  # d loss / d logits
        d_out.scatter_add_(1, actions, d_log_ratio)
        if entropy_slope:  # loss - c * sum H: d / d logits = c * p * (log p + H)
            entropy = -(probs * log_p).sum(-1, keepdim=True)
            d_out = d_out + entropy_slope * (probs * (log_p + entropy))
    sink.mm(w_out, d_out.t(), features)
    sink.sum0(b_out, d_out)
    d_features = torch.mm(d_out, p[w_out])
    # the critic
    if net.critic is None:
        critic_hs, critic_features = hs, features
    else:
        critic_hs = _forward(net.critic, p, x)
        critic_features = critic_hs[-1]
    w_v, b_v = net.value
    values = torch.addmm(p[b_v], critic_features, p[w_v].t()).squeeze(-1)
    error = values - returns
    sq = torch.dot(error, error)
    if net.use_critic:
        d_values = (error * value_factor).unsqueeze(-1)
    else:
        d_values = torch.zeros_like(error).unsqueeze(-1)
    sink.mm(w_v, d_values.t(), critic_features)
    sink.sum0(b_v, d_values)
    d_critic = torch.mm(d_values, p[w_v])
    if net.critic is None:
        _backward(net.actor, p, hs, d_features + d_critic, sink, k.one)
    else:
        _backward(net.actor, p, hs, d_features, sink, k.one)
        _backward(net.critic, p, critic_hs, d_critic, sink, k.one)
    if not net.use_critic:
        sq = k.zero
    clipped_count = (clipped != ratio).sum(dtype=ratio.dtype)
    return torch.stack((pg, sq, ratio.sum(), log_ratio.sum(), clipped_count))


def constants(cfg: PPOConfig, dtype: torch.dtype, device: torch.device | str) -> Constants:
    def full(value: float) -> Tensor:
        return torch.full((), value, dtype=dtype, device=device)

    return Constants(full(1.0), full(0.0), full(1.0 - cfg.clip), full(1.0 + cfg.clip))


class ClosedFormPPO:
    """Loss parts and gradients of one minibatch share, for a policy :func:`supports` accepts."""

    def __init__(self, policy: ActorCritic, cfg: PPOConfig, params: list[nn.Parameter] | None = None) -> None:
        if not supports(policy, cfg):
            raise ValueError("this policy or config needs autograd")
        self.policy = policy
        self.cfg = cfg
        self.params = list(params) if params is not None else [p for p in policy.parameters() if p.requires_grad]
        self.net = Net.of(policy, self.params, cfg)
        first = self.params[0]
        self.k = constants(cfg, first.dtype, first.device)
        self._value_scale: dict[float, Tensor] = {}
        self._sink = GradSink([p.grad for p in self.params])  # type: ignore[misc]

    def to(self, device: torch.device | str) -> None:
        """Move the cached constants along with the policy (after ``FlatParameters.to`` moved the gradients)."""
        self.k = Constants(*(t.to(device) for t in self.k))
        self._value_scale = {}
        self._sink = GradSink([p.grad for p in self.params])  # type: ignore[misc]

    def scalars(self, samples: int, scale: float) -> tuple[Tensor, float]:
        """``minibatch_gradient``'s (value_factor, entropy_slope) for ``samples`` samples scaled by ``scale``;
        the factor is a 0-dim tensor made once per scale."""
        factor = self._value_scale.get(scale)
        if factor is None:
            factor = self._value_scale[scale] = torch.full((), 2.0 * self.cfg.vf_coef * scale,
                                                           dtype=self.k.one.dtype, device=self.k.one.device)
        slope = self.cfg.ent_coef * scale * (samples if self.net.log_std is not None else 1)
        return factor, slope

    @torch.no_grad()
    def step(self, obs: Tensor, actions: Tensor, offset: Tensor, neg_adv: Tensor, returns: Tensor,
             scale: float) -> Tensor:
        """Write d loss / d parameters into every ``.grad``; returns the metric parts (see ``_step_loss``)."""
        return minibatch_gradient(self.net, self.params, self._sink, self.k, obs, actions, offset, neg_adv, returns,
                                  *self.scalars(obs.shape[0], scale))

"""Expert parallelism of an MoE block (`models/decoder.MoE`): its routed experts spread over an ep group.

Where the groups sit (Megatron-Core's parallel folding, etp = 1): the block's d stage ranks, which the attention
splits dp × tp as any block, are regrouped for the routed experts as ep × edp, ep contiguous: stage position
p = ep_index + ep · edp_index (`mesh.py` builds the (edp, ep) mesh). The ep ranks of a group hold E/ep experts
each, expert e on ep rank e // (E/ep); the edp groups replicate them. The experts' weights are DTensors
(Replicate over edp, Shard(0) over ep): parameter names and full values are the one-process model's, so `--check`
and checkpoints see the whole expert stacks. Their gradients are summed over edp (not dp; `GradientAllReduce`);
the router, shared expert, norms and attention keep the block's dp sync. Under ZeRO the block's other parameters
are sharded over dp as any block's; its experts are left to FSDP2 as `ignored_params` and stay replicated over edp
(ZeRO-0 for the experts: whole gradients and optimizer state for E/ep experts per rank).

One dispatch per forward of the block, on each rank of an ep group (N local tokens, k experts each):
  1. sort the N·k token copies by expert (`RoutedExperts.forward`), count copies per expert (E,);
  2. exchange the counts: all_to_all_single of (ep, E/ep) — row j what this rank sends to rank j's experts,
     received as what rank j sends to this rank's;
  3. all_to_all_single of the copies with those variable split sizes (dispatch);
  4. regroup the received copies from (source rank, expert) to (expert, source rank) order, run this rank's
     experts, restore the order;
  5. the reverse all_to_all_single (combine); the decoder weights and sums the k outputs of each token.
Backward runs the adjoint of each all_to_all (the same exchange with send and receive sizes swapped;
`_AllToAll`), so the copies' gradients return to their tokens' ranks and each expert's weight gradient sums over
every token routed to it in the ep group. Dropless: no capacity factor, whatever the imbalance.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from uniap.models.decoder import Block, MoE, RoutedExperts
from uniap.runtime.data_parallel import GradientAllReduce


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with variable split sizes (gloo and NCCL); backward: the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, receive: list[int], send: list[int], group) -> torch.Tensor:
        ctx.receive, ctx.send, ctx.group = receive, send, group
        return _exchange(x, receive, send, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _exchange(grad, ctx.send, ctx.receive, ctx.group), None, None, None


def _exchange(x: torch.Tensor, receive: list[int], send: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(receive),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=receive, input_split_sizes=send, group=group)
    return out


class ExpertExchange:
    """`RoutedExperts.dispatch` under expert parallelism: steps 2–5 of the module docstring."""

    def __init__(self, experts: RoutedExperts, group, ep: int):
        self.experts, self.group, self.ep = experts, group, ep

    def __call__(self, copies: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        sent = counts.view(self.ep, -1)  # (ep rank, its expert): copies this rank sends
        received = torch.empty_like(sent)
        dist.all_to_all_single(received, sent, group=self.group)
        send, receive = sent.sum(1).tolist(), received.sum(1).tolist()
        arrived = _AllToAll.apply(copies, receive, send, self.group)
        # received is in (source rank, expert) order; the experts run on (expert, source rank) order
        sizes = received.tolist()
        starts = (received.reshape(-1).cumsum(0) - received.reshape(-1)).view_as(received).tolist()
        by_expert = torch.cat([torch.arange(starts[j][e], starts[j][e] + sizes[j][e], device=copies.device)
                               for e in range(len(sizes[0])) for j in range(self.ep)])
        out = self.experts.compute(arrived[by_expert], received.sum(0))
        back = torch.empty_like(out).index_copy(0, by_expert, out)
        return _AllToAll.apply(back, send, receive, self.group)


def expert_parameters(layer: nn.Module) -> set[nn.Parameter]:
    """The routed experts' parameters of an MoE block (empty for any other layer)."""
    moe = getattr(layer, "mlp", None) if isinstance(layer, Block) else None
    return set(moe.experts.parameters()) if isinstance(moe, MoE) else set()


def apply_expert_parallel(layer: Block, mesh: DeviceMesh) -> Block:
    """Shard an MoE block's routed experts over `mesh` (dims ("edp", "ep")), route its tokens through the ep
    group, and sum the experts' gradients over edp (see the module docstring)."""
    experts = layer.mlp.experts
    ep, index = mesh.size(1), mesh.get_local_rank("ep")
    for name, full in list(experts.named_parameters()):
        part = full.detach().chunk(ep)[index].clone()
        setattr(experts, name, nn.Parameter(DTensor.from_local(part, mesh, (Replicate(), Shard(0)), run_check=False)))
    experts.dispatch = ExpertExchange(experts, mesh.get_group("ep"), ep)
    if mesh.size(0) > 1:
        experts.gradient_sync = GradientAllReduce(list(experts.parameters()), mesh.get_group("edp"))
    return layer

"""torch.nn.utils.prune's contract: methods, the reparametrization, selection, global and sharded pruning."""

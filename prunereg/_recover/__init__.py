"""Recovery: bringing a shrunk or pruned language model's quality back, block by block, from its teacher."""

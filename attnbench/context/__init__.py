"""Context extension: RoPE scalings evaluated for capability (perplexity, passkey) and cost (microbench).

perplexity  sliding-window (PI) and truncated-window (YaRN) perplexity of ``model(tokens) -> logits``
passkey     synthetic passkey-retrieval documents and their greedy-retrieval score
experiment  pretrain at L, extend with each method (with and without a short fine-tune), evaluate
cost        fwd / fwd_bwd / decode microbench at extended lengths, with peak memory and OOM rows
tables      PI-style and YaRN-style tables from the capability rows
commands    ``attnbench context ...``
"""

"""torchrun, launched with its stores bound where the ranks reach them and nowhere else: `local` (one node,
loopback), `node` (one node of a multi-node job), the store binding they share, and the rendezvous a
multi-node job draws at submission."""

"""Reading runs: the tidy results table, run status, statistics over seeds and the papers' claims."""

"""What a study's ledger rows add up to: success tables, best configs, comparisons, CSV tables, plots."""

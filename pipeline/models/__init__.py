"""Model zoo: small, self-contained models with fixed-seed random weights (nothing downloaded)."""

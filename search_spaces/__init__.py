"""The papers' search grids as data (standard library only)."""

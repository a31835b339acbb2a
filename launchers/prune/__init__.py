"""Successive halving: the rule on numbers (`rule`) and its passes over a sweep directory (`rungs`)."""

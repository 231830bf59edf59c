"""Ekya's flow side (NSDI 2022): continuous retraining windows on drifting streams, its Salus executor, records and chart."""

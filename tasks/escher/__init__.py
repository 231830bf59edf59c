"""ESCHER's flow side (SoCC 2021, thesis ch. 4): each policy of the ESL library run on real tasks, and its records."""

"""infertune.operator: the kopf operator, its API models and pure builders."""

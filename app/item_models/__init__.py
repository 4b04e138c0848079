"""Qt item models. Named …ListModel / …TableModel so they never clash with LLM 'models'."""

"""The operator's side: the admin API, accounts and keys, catalogue editing, usage
queries, the OpenAPI document and the web console."""

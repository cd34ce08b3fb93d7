"""Graph layer: load -> IR -> passes -> Plan (executor) -> export."""

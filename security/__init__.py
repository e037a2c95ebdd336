"""Security: the SSRF guard on outbound URLs, API keys, webhook signatures."""

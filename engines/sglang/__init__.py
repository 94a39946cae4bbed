"""SGLang 0.5.23's real unified allocator behind kvarena's adapter protocol (``adapter``)."""

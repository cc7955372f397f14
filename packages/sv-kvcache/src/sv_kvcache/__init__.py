"""sv_kvcache."""

"""What an XID, a throttle reason or a finding means and what to do: data, no I/O."""

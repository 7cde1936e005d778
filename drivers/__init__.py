"""Server process drivers: start, watch and stop servers by the PIDs the tool started."""

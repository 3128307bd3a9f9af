"""parallel.InFlight: how far the host may run ahead of the devices."""
from unittest import mock

from bengrapheme import parallel


def test_in_flight_waits_for_the_oldest_beyond_its_limit():
  waited = []
  with mock.patch.object(parallel.jax, 'block_until_ready', waited.append):
    in_flight = parallel.InFlight(2)
    for step in range(5):
      in_flight.push(step)
      # After pushing step s, only steps s - 1 and s may still be running.
      assert waited == list(range(step - 1))

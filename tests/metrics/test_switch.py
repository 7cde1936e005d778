from replay.metrics.switch import SwitchTracker


def test_classes_follow_send_order_and_combine():
    t = SwitchTracker()
    a1 = t.on_send("a", compaction=False)
    t.on_done()
    b1 = t.on_send("b", compaction=False)
    t.on_done()
    a2 = t.on_send("a", compaction=False)
    t.on_done()
    a3 = t.on_send("a", compaction=True)
    b2 = t.on_send("b", compaction=False)  # a3 still in flight
    t.on_done()
    t.on_done()
    assert a1.flags == ("cold",)
    assert b1.flags == ("cold",)
    assert (a2.flags, a2.from_session) == (("switch",), "b")
    assert a3.flags == ("continue", "compaction")
    assert (b2.flags, b2.from_session) == (("switch", "concurrent"), "a")

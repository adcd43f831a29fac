"""Drives `nvstore serve` with redis-py: strings, hashes, sorted sets,
transactions (MULTI/EXEC, WATCH), pipelines, SCAN, errors, INFO.

usage: redis_py_check.py PORT PROTOCOL   (PROTOCOL 3 = redis-py 8's default, or 2)
"""
import sys

import redis

port, proto = int(sys.argv[1]), int(sys.argv[2])
kw = {} if proto == 3 else {"protocol": 2}  # 3: redis-py's own default
r = redis.Redis(port=port, decode_responses=True, **kw)

assert r.ping()
hello = r.execute_command("HELLO")
if isinstance(hello, list):  # RESP2: the map comes as a flat array
    hello = dict(zip(hello[::2], hello[1::2]))
assert hello["proto"] == proto and hello["server"] == "redis", hello
r.flushdb()

# strings
assert r.set("a", "1") is True and r.get("a") == "1"
assert r.incr("a") == 2 and r.incrby("a", 5) == 7 and r.decr("a") == 6 and r.decrby("a", 2) == 4
assert r.set("a", "x", nx=True) is None
assert r.set("a", "y", xx=True, get=True) == "4"
assert not r.setnx("a", "z")
assert r.getset("a", "g") == "y" and r.getdel("a") == "g" and r.get("a") is None
assert r.mset({"m1": "1", "m2": "2"}) and r.mget("m1", "m2", "nope") == ["1", "2", None]
assert not r.msetnx({"m2": "9", "m3": "3"})
assert r.append("s", "ab") == 2 and r.strlen("s") == 2 and r.getrange("s", 0, 0) == "a"
assert r.exists("m1", "m2", "nope") == 2 and r.type("m1") == "string"
assert r.delete("m1", "nope") == 1 and r.unlink("m2") == 1

# hashes
assert r.hset("h", mapping={"f1": "1", "f2": "2"}) == 2
assert r.hgetall("h") == {"f1": "1", "f2": "2"}
assert r.hincrby("h", "f1", 10) == 11 and r.hlen("h") == 2
assert r.hkeys("h") == ["f1", "f2"] and r.hvals("h") == ["11", "2"]
assert not r.hsetnx("h", "f1", "x") and r.hexists("h", "f2") and not r.hexists("h", "zz")
assert r.hmget("h", ["f1", "zz"]) == ["11", None]
assert r.hdel("h", "f1", "zz") == 1 and r.hget("h", "f2") == "2"
assert r.type("h") == "hash"

# sorted sets
assert r.zadd("z", {"a": 1, "b": 2.5, "c": -1}) == 3
assert r.zscore("z", "b") == 2.5
assert r.zrange("z", 0, -1) == ["c", "a", "b"]
assert [tuple(x) for x in r.zrange("z", 0, -1, withscores=True)] == [("c", -1.0), ("a", 1.0), ("b", 2.5)]
assert r.zrangebyscore("z", "(1", "+inf") == ["b"]
assert r.zrevrangebyscore("z", "+inf", "-inf", start=0, num=1) == ["b"]
assert r.zrange("z", "+inf", "(1", byscore=True, desc=True) == ["b"]
assert r.zrank("z", "b") == 2 and r.zcard("z") == 3 and r.zcount("z", "-inf", "+inf") == 3
assert r.zincrby("z", 1, "a") == 2.0
assert r.zadd("z", {"a": 5}, xx=True, ch=True) == 1
assert r.zrem("z", "c", "nope") == 1
assert r.zadd("lex", {"x": 0, "y": 0, "w": 0}) == 3
assert r.zrangebylex("lex", "[x", "+") == ["x", "y"]
assert r.type("z") == "zset"

# transactions
p = r.pipeline(transaction=True)
p.set("t1", "1").incr("t1").hset("th", "f", "v").get("t1")
assert p.execute() == [True, 2, 1, "2"]

other = redis.Redis(port=port, decode_responses=True, **kw)
with r.pipeline() as p:
    p.watch("w")
    other.set("w", "changed")
    p.multi()
    p.set("w", "mine")
    try:
        p.execute()
        raise AssertionError("EXEC after a WATCHed key changed must fail")
    except redis.WatchError:
        pass
assert r.get("w") == "changed"

def bump(pipe):
    v = int(pipe.get("counter") or 0)
    pipe.multi()
    pipe.set("counter", v + 1)

for _ in range(5):
    r.transaction(bump, "counter")
assert r.get("counter") == "5"

# a plain pipeline
p = r.pipeline(transaction=False)
for i in range(1000):
    p.set(f"p{i}", i)
assert all(p.execute())
assert r.get("p999") == "999"
assert len(set(r.scan_iter(match="p1*", count=50))) == 111
assert sorted(r.keys("p99*")) == ["p99", "p990", "p991", "p992", "p993", "p994", "p995", "p996", "p997", "p998", "p999"]
assert r.dbsize() > 1000

# errors as Redis words them
try:
    r.execute_command("NOSUCH", "x")
    raise AssertionError("unknown command must fail")
except redis.ResponseError as e:
    assert str(e).startswith("unknown command 'NOSUCH', with args beginning with: 'x'"), e
try:
    r.hget("p1", "f")
    raise AssertionError("WRONGTYPE expected")
except redis.ResponseError as e:
    assert str(e).startswith("WRONGTYPE"), e
try:
    r.set("e", "1", ex=10)
    raise AssertionError("expiry must be refused")
except redis.ResponseError as e:
    assert "expiry is not supported" in str(e), e

# ordered reads and INFO
assert r.execute_command("NV.RANGE", "p0", "p1", "LIMIT", "2") == ["p0", "p1"]
assert r.execute_command("NV.PREFIX", "p99", "LIMIT", "2", "WITHVALUES") == ["p99", "99", "p990", "990"]
info = r.info("nvstore")
assert "flushes" in info and "splits" in info, info
assert r.info()["redis_version"]
assert r.config_get("save") == {"save": ""}
assert r.client_setname("py") and r.client_getname() == "py"

print(f"redis-py {redis.__version__} protocol {proto}: ok")

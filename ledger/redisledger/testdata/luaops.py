#!/usr/bin/env python3
"""Server CPU cost of single Lua operations inside a Redis script.

Starts its own redis-server and runs, for each variant, 20,000 EVALSHA calls
of a script that repeats one operation 100 times (8 connections, median of 3
rounds); (variant - trivial) / 100 is the cost of one operation. The script
calls carry the reserve benchmark's 6 keys and 13 arguments. CPU is
redis-server utime+stime from /proc, as in scriptcpu.py.
Usage: ledger/redisledger/testdata/luaops.py [port]
"""
import os, subprocess, sys, tempfile, time
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lua')
port = sys.argv[1] if len(sys.argv) > 1 else '6392'
variants = {
 'a trivial': 'return 1',
 'k redis.call HMGET x10 (/10)': "for i=1,10 do redis.call('HMGET', KEYS[5], 'a', 'b', 'c', 'd') end return 1",
 'l redis.call HINCRBY x10 (/10)': "for i=1,10 do redis.call('HINCRBY', KEYS[5], 'r:1', 1) end return 1",
 'm reply of 40 integers (once)': "local t = {} for i = 1, 40 do t[i] = i end return t",
 'b2 match4 x100': "local x for i=1,100 do x = string.match('3:3600:1125899906842624:b', '^(%d+):(%d+):(%d+):([bw])$') end return 1",
 'c find x100': "local x for i=1,100 do x = string.find('1125899906842624', '^[1-9]%d*$') end return 1",
 'd tonumber x100': "local x for i=1,100 do x = tonumber('1125899906842624') end return 1",
 'e table x100': "local x for i=1,100 do x = {} end return 1",
 'f closure x100': "local x for i=1,100 do x = function() return i end end return 1",
 'g gmatch x100': "local x for i=1,100 do for f in string.gmatch('1,512,0,512,0,0,0', '[^,]+') do x = f end end return 1",
 'h sub x100': "local x for i=1,100 do x = string.sub(KEYS[5], -5) end return 1",
 'i loop x100': "local x = 0 for i=1,100 do x = x + i end return 1",
 'j concat x100': "local x for i=1,100 do x = 'c:' .. i .. ':' .. 3600 end return 1",
}
d = tempfile.mkdtemp()
subprocess.check_call(['redis-server', '--port', port, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
                       '--daemonize', 'yes', '--dir', d, '--pidfile', d + '/p.pid', '--logfile', d + '/l.log'])
time.sleep(0.5)
pid = int(open(d + '/p.pid').read())
tck = os.sysconf('SC_CLK_TCK')
def cpu():
    f = open('/proc/%d/stat' % pid).read().split(')')[1].split()
    return (int(f[11]) + int(f[12])) * 1e6 / tck
def cli(*a):
    return subprocess.check_output(['redis-cli', '-p', port] + list(a)).decode().strip()
spec = "1T/3:3600:1125899906842624:b,0:60:1125899906842624:b,6:0:1048576:b;2K/3:86400:1125899906842624:b"
keys = ['sluice:{T}:m', 'sluice:{T}:L', 'sluice:{T}:U', 'sluice:{T}:q:__rand_int__', 'sluice:{T}:s:T', 'sluice:{T}:s:K']
args = ['', 'cand', '120000', '__rand_int__', '3600000', '0', 'o', 'd', '60000', '1', '1,512,0,512,0,0,0,0', spec, '', '0', '0', '0']
shas = {k: cli('script', 'load', v) for k, v in variants.items()}
N = 20000
res = {k: [] for k in shas}
try:
    for _ in range(3):
        for name, sha in shas.items():
            cli('flushall')
            c0 = cpu()
            cmd = ['redis-benchmark', '-p', port, '-n', str(N), '-r', '100000000', '-c', '8', '-q', 'EVALSHA', sha, str(len(keys))] + keys + args
            subprocess.check_call(cmd, stdout=subprocess.DEVNULL)
            res[name].append((cpu() - c0) / N)
    for k in sorted(res):
        v = sorted(res[k])
        print('%-22s µs/call: median %5.1f  (runs %s)' % (k, v[1], ', '.join('%.1f' % x for x in v)))
finally:
    subprocess.call(['redis-cli', '-p', port, 'shutdown', 'nosave'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


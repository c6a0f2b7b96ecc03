#!/usr/bin/env python3
"""Server CPU cost of the reserve script, by stage.

Starts its own redis-server, loads reserve.lua cut short after each stage
(parse, record lookup, admission, writes) plus the whole script and a trivial
"return 1", runs 20,000 EVALSHA calls of each through redis-benchmark (8
connections, 3 rounds) and reports redis-server CPU time (utime+stime from
/proc) per call, which is far less sensitive to a loaded machine than wall
time. Usage: ledger/redisledger/testdata/scriptcpu.py [port]
"""
import os, subprocess, sys, tempfile, time

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lua')
port = sys.argv[1] if len(sys.argv) > 1 else '6393'
prelude = open(os.path.join(here, 'prelude.lua')).read()
body = open(os.path.join(here, 'reserve.lua')).read().splitlines()
stages = {'1 parse': '-- Idempotency first', '2 record': 'local fence = ', '3 admission': '-- Apply.',
          '4 writes': "redis.call('ZADD', KEYS[2], le"}
srcs = {}
for name, mark in stages.items():
    i = next(k for k, l in enumerate(body) if l.startswith(mark))
    srcs[name] = "\n".join(body[:i]) + "\nreturn 1\n"
srcs['5 whole reserve'] = "\n".join(body)

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
shas = {'0 trivial': cli('script', 'load', 'return 1')}
for name, src in srcs.items():
    shas[name] = cli('script', 'load', '#!lua\nlocal NDIMS, SLOTS = 8, 6\n' + prelude + '\n' + src)
N = 20000
res = {k: [] for k in shas}
try:
    for _ in range(3):
        for name, sha in shas.items():
            cli('flushall')
            c0 = cpu()
            cmd = ['redis-benchmark', '-p', port, '-n', str(N), '-r', '100000000', '-c', '8', '-q', 'EVALSHA', sha]
            cmd += ['0'] if name == '0 trivial' else [str(len(keys))] + keys + args
            subprocess.check_call(cmd, stdout=subprocess.DEVNULL)
            res[name].append((cpu() - c0) / N)
    for k in sorted(res):
        v = sorted(res[k])
        print('%-16s redis-server CPU µs/call: median %5.1f  (runs %s)' % (k, v[1], ', '.join('%.1f' % x for x in v)))
    print('load average:', open('/proc/loadavg').read().split()[:3])
finally:
    subprocess.call(['redis-cli', '-p', port, 'shutdown', 'nosave'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

import sys, torch
sys.path.insert(0, 'tests')
import jitgemm
from gpu_helpers import *
gen = torch.Generator(device='cuda').manual_seed(1)
for (m,n,k) in [(1,7,64),(1,8,64),(3,9,64),(130,127,64),(64,127,128)]:
    for odt in ('bf16','fp32'):
        a = random_operand(m,k,'bf16','row',gen); b = random_operand(k,n,'bf16','row',gen)
        buf, out = guarded_out(m,n,odt)
        jitgemm.gemm(a,b,out=out, out_dtype=torch.float32 if odt=='fp32' else None)
        torch.cuda.synchronize()
        mask = torch.ones(buf.shape, dtype=torch.bool, device='cuda'); mask[GUARD_ROWS:GUARD_ROWS+m, GUARD_COLS:GUARD_COLS+n] = False
        bad = (~torch.isnan(buf.float())) & mask
        idx = bad.nonzero().tolist()
        print(m,n,k,odt,'guard violations', len(idx), idx[:6], 'err', rel_error(out,a,b))

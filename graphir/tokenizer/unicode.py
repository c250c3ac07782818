"""Unicode 15.1 as llama.cpp's generated tables have it: each code point's class, and simple lowercase.

The pre-tokenizers cut text by these classes and WordPiece normalizes by both, so they must not move with the
Python version: `unicodedata` follows the Unicode of its Python (3.10 has 13.0, 3.11 14.0). Both tables are
embedded, as deltas between code points, zlib-compressed and base85-encoded.
"""

from __future__ import annotations

import base64
import bisect
import re
import zlib

# Unicode 15.1 classes of all code points, the data llama.cpp's unicode-data.cpp is generated from:
# run-length encoded as "<hex start delta><class>" with class L (letter), N (number),
# P (punctuation), M (mark), S (symbol), W (White_Space, which wins over the category) or
# O (other, unassigned included), then zlib-compressed and base85-encoded. Embedded rather
# than taken from `unicodedata`, whose Unicode version moves with the Python version
# (3.11 has 14.0). Regenerate on a Python whose unicodedata.unidata_version is "15.1.0" with
#   runs: for cp in range(0x110000): cls = "W" if cp in WHITE_SPACE else
#         (unicodedata.category(chr(cp))[0] if that is in "LNPMS" else "O"); emit on change
#   text = "".join(f"{start - previous_start:x}{cls}" ...)
#   base64.b85encode(zlib.compress(text.encode(), 9))
# WHITE_SPACE being 0x09-0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000-0x200A, 0x2028, 0x2029,
# 0x202F, 0x205F and 0x3000.
_CLASS_RUNS = (
    "c-oDaNtU!Y5`?dWM&J$-;yo>L&3OMK^k)u{e`Zy8RWB4lfRKDJH#f!5=C9P8|8i^SZq1CiY^(2K^~G&=({-my_guF8<(k{R^"
    "dm8tX186Bi`PtEc8k8<5>~!P-Msa2Y(18vUnTXi*s9&RIu87H#W!D~=C}B)Swhn<M&u)5NtyP}{IX?k_}nxt7eBAO+nHVcxw"
    "^`$)xX2FskpsGR`$&~dDUg0ulvf<YbbuNF5z)3zPggl;yU7ut1MlaUU{@^C74y0Hf5r_D(m`^=DK6##RTu_T(o@P28(Ha=4I"
    "V>m76s+zut0au7OMWwzpK=gloCYbt-<VZjvK-pY0u|{css~utL@iRe_n<Tp@Fc#b}WVC2C)@AIllCWFiQ7z>J`KGPL_8KQXS"
    "dRLf<X^J6*xJy^2I_V_H>0>8%+ZOd`NFcxO1w%I~+dlUC_q4e4%*MbdpYIpIEMTQ>`QS<Zs@6P>P<lDJ6GJd%xNG%yl9^hm`"
    "qU9pr{soh_Yuyj!z^8;iGAWu#xhj`upIWL3GhSaTzQgza?tNpdwzs|MKhCrf;2Y+v!1Qa4?Ux%rm&s4C-z9YA+5vbz;q-I$K"
    "VMSm;5(6D#@Bln3`S1`oqQCOYz3J&TH>O`SP7k4W+$&QX-5e|)utoGN5t!d51Yy=eFrY-dwPFtHhZ>(({oR@X+eQ-C@Qtv2m"
    "|AKUL5OI_Zcf#vdH*|MJ}pZORBq&53o9z?bzA<ntFWApic1`t8!6QMXQb=oAE!EvmUAz@F@E5*^Ek0Vs@2HJPir{Etcon&z}"
    "qTU!JN~!)Hbe!rVIJib6Z|jie=!P*yFo<spBIb6-Z6N<iG#umn5>+@4GmFwn-MS-(ATKcD>Cbs#E(*h8#atTqX#vXs}|(yjo"
    "r>CAeGh<QU2UPdqv$1+2ZK9s~3#24_CWoR#+yO_mtdxOdV(`bA|^`^RM?Nh+~-f$GR>dxH))nEKwozNV}z}UAschRo#+Eq_u"
    "NPpC;O=42z6a(N@Rhk}=#Uiu4NHeSxv=l@?*e=>NI0f_N7-|GR?v3oj^BN!QeUDp934K;={i*e_8x5)uxH`M4^SO_;U(oI9r"
    "Z3-;`WInZPsX8+HY`>rFr&3T$V7>9WQcG<R#hKj&936}WqUVGJ%4(c4HeMN^Vk#5tWcK#PM3rQJRFHocPCBgKAM|5pifIUdb"
    "}0~E9YtD;_AWr=)JPdOr)^t<~{Ji-H~u`iHCVEmkdxf;1s=^*M6fv82Tvks~QW<2JwFw0-?Xv#|H}VXr3JbNC$RDKUo@+hDR"
    "^pmBT`2;pAL1@W)FK?<EXG8iEkE7ExhR`-)AqtVfp$e2E=&uu*Kg0yuQRSWJE`w8e#p5B%~YS5CN?kD>FO@}$HB`QtAoY&ca"
    "qgTU5c3h*jgv5raZC=s<PAkC^{nK3Dk%F@t&QQV~ds(#`Om@1Oa1+dROQhOn;5$xg+rQt!lm8iOOw#qf;R^1(Ns1@1SjDE1T"
    "npM}TnpdHzCK8)$%uf%;U$~>ar?(M!s>un`Dzxx44so8h`gc#Cn~D&-*Q8?R#jSiwCjZE`S9~vFu#7<j|87C&*|!M&fDIZ7k"
    "Z}W>W)Vlmg3Q|o_9fd+s6Rj5;D<~Q`KgF_aTi1fMHX{%qd3(N4ux@8Em+`-l3cH+KQz;is|?es6K4FsS`?N7mEniKD)!K&-^"
    "O-!X^2CXs-?Q{+A7|_JGfqSfP`4Qurx1W#)-wGWY--G2Y;tjq_+$zJn-ORk`iDVqf>KbT2yX6SBult3<&hLqDBhMZe_kc(bn"
    "zf0~Q2OhL7Fs`XhFJ|Be8_pzcKUlTvOHc(eW<lR0kbI9`dP%9rF|`$-7$$OI~DS_s$h2}N2kHY1o!^={(EMs2|ughaJX3KxH"
    "sM{_V=efOhhPLp6Hl_kej-0sfB8`PJej87){c`Yt!mGMCvjq<_EsKEY{gvv-s9n07fpus%)d1$9T#zo<xZ%)!g9u;xFUYlx>"
    "MvS}K#;J;v)X#Na;tGtiHCz@3zwqlQN)Y*}j8eU^hqPVRb`-f;wRv(VAoi>3{e)?xZktp%He4bl6{Af@s7v!cZw85{ixWmP#"
    "<8xeFn}y4v9QZW6aB~fG&<<y`XMx)Oap46<EDKl+c*AiA?#i;_z}V%>6%0fO)@Tk#A%nWPRFWbYR&||vUi!@i^bAq(cNrotv"
    "IjnqiKC_v!3(JZlZw7w-eK84MjpBWSy^ky@}^xEn#f?EGckn26&;b1_)$&Rr2&Y;U-g}vNk?MMovSU#f$mzdo+8-Cz{f%M6y"
    "EflkO4g={eqU0P~kfMf{t{TofR;c4yPRKH0HjvWMHEGFIX)X&YH^wK)Gd@nozDrjI3VM%#C?y3L;{Lrw4F^qhbQN|vybQXOA"
    "f7DxIw5i9U)DeJ_uIF7n!J9WC9S(V}=_p1cj5!)7zlEsAh5NPj%Nu#^nn-mnma0+d(TC*-`EhIjd`SD3LyeV;`w6jjs(AXv;"
    "7eky86o}aeOO0wTBf|C;pXM^+0%}@3;NQ6KI134kxA-ce07PfN<9bekpV&D_{T8Ip_eexdC_mHDW;#mNQCA!)^XV)7DPqccs"
    "NS+cdG-<Ac=Q{Zqvz{Xf6#yfNtx=zshwtWA@Bp?#XF#{gX5+uJM5z;7Fj6WiO!&I5+Cc{6Ple)+|v?X%i~AvPoH!2@fKxz57"
    "kfD?0h(j(&q2~GyeSw94|pyjYIoL2jp63o2%N{hF&5lQ9Do{85PLRWQRQGtc+ir5xGE!l#G$QNK1^^rH1mH1Wg)U!mWBhjRK"
    "r*pMxk^KmC;-f4`d`aiB9H+gNBWF$(Q1KA=MLqgr=KR|d`MphrrMwc`n)+do-<JJ0s6{it(+J^oVb;V<+5IzG=nh>Abfv+gZ"
    "+3!k)*mneZbAZT>l$;v%_o#AYF)%w{tCQepy&pfclYZr&h8GV0F668#=Za?bqo5(_c4p6s!(+npa^}4!sSBXhNAzhNT)KAk6"
    "TK6*5F>&+R$cD58MdiimamZ!M*I)<aA*g0g`$H*DR$*tbKShvU^QI%|)zZb&5ba;0ArEak&otC~X#WB5uPU?"
)


def _entries(chunks: tuple[str, ...], entry: str) -> list[tuple[int, str]]:
    """(code point, field) of each entry of an embedded table: ``entry`` matches the hex delta from the previous
    entry's code point, then the field."""
    text = zlib.decompress(base64.b85decode("".join(chunks))).decode("ascii")
    out: list[tuple[int, str]] = []
    cp = 0
    for delta, field in re.findall(entry, text):
        cp += int(delta, 16)
        out.append((cp, field))
    return out


def _class_runs() -> tuple[list[int], str]:
    runs = _entries(_CLASS_RUNS, r"([0-9a-f]+)([LNPMSWO])")
    return [cp for cp, _ in runs], "".join(cls for _, cls in runs)


_RUN_STARTS, _RUN_CLASSES = _class_runs()


def unicode_class(cp: int) -> str:
    """The class llama.cpp gives a code point: one of L N P M S W O (see _CLASS_RUNS)."""
    if not 0 <= cp < 0x110000:
        return "O"
    return _RUN_CLASSES[bisect.bisect_right(_RUN_STARTS, cp) - 1]


# Unicode 15.1 simple lowercase mappings (UnicodeData.txt field 13), the data llama.cpp's
# unicode_tolower is generated from: "<hex code point delta><signed hex offset to its lowercase>,"
# per mapped code point, zlib-compressed and base85-encoded. Embedded because str.lower() moves
# with the Python version (3.10 has Unicode 13.0 and misses the 40 case pairs 14.0 added). Regenerate
# on a Python whose unicodedata.unidata_version is "15.1.0", where the first code point of str.lower()
# is the simple lowercase (the full one differs only for U+0130, adding U+0307), with
#   pairs: for cp in range(0x110000) (surrogates skipped): low = chr(cp).lower();
#          if low != chr(cp): emit (cp, ord(low[0]))
#   text = "".join(f"{cp - previous_cp:x}{lower - cp:+x}," ...)
#   base64.b85encode(zlib.compress(text.encode(), 9))
_LOWER_PAIRS = (
    "c-rk)>6WV?41OTw97&MnaoBwSN4SY-wVlpXduv;#^CMqKSPWs2L@NPp^HMP8`QL;UO+ct-SCYw|Dey)I+|?NCY2LF!iwp}zDx;7x"
    "6$W5~bk9;?h-VFYDrKZnR)b!TQpb98_9aq;Q9%W~(6Ci`X<ClsfU0p~GVzlCzaw!umNYaAiEh>C+uZJ8RYRI;fYHS=uq#P+btW>g"
    "tUCsK)kFpJvZ}@ls~ao8u*1051RyjY4dg||e$64-<>W0IYvIV;Z9X*;)99G$4P+;)8AR7U7T~P`AF*k}-k0GS^*<goe5x&vClts_"
    "b5Mwy_Chi&eLRE8%qV3P-e#`-V}EQFb63gvC}X1f4@Uf|*XrOm|1&8_m1F-4rs4S6_AU8u^zqJqx9SrSEa=ua%I{>z*Loc$@MLC3"
    "QPw5+!Tj3V=nDCyvF!=C9Tx_$Wde%BfcI6G8!e%w?WKrmL(zmv4HTh<U*p4oqZLGY?+xML>%gKq^qXxv)Sy9v?<t0orSR?nU+nqg"
    "TSB09=bAn<3#zZIoF3|)M66ouo8NMQPcdmnWW6pserh-b_jGjbhf4iI=fyes5n6q9PjofU(M>6iEf!NZ&37BIzOq=Es!R_}6burC"
    "fho>_U}$e|P{}8Rhe5s`!y+eSIrlIvTINYuNH356but3j$isv42Q=De0i1=}3UFVyJBON^m=ZY&s6G~ADQ}+7>pJ)DDMuRuaZa@!"
    "0R921UPRd"
)

LOWER = {cp: cp + int(offset, 16) for cp, offset in _entries(_LOWER_PAIRS, r"([0-9a-f]+)([+-][0-9a-f]+),")}

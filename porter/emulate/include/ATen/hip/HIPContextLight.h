// porter emulated HIP target: this header of torch HIP side is porter_emu/torch_hip.h (written for porter)
#pragma once
#include <porter_emu/torch_hip.h>

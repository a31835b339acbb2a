"""Word lists for the synthetic story corpus.

Kept as plain data so the generator reads as a grammar. Entries carry the attributes the plots
depend on (an object's material decides how it breaks and how it is mended; a place decides what
is seen there), which is what makes the stories causally consistent and therefore learnable.
"""

from __future__ import annotations


def words(text: str) -> list[str]:
    return text.split()


def phrases(text: str) -> list[str]:
    return [p.strip() for p in text.split("|") if p.strip()]


GIRL_NAMES = words("""
Lily Mia Emma Ava Zoe Lucy Rosie Ella Chloe Sophie Ruby Grace Hannah Molly Daisy Amy Anna Sara
Nora Ivy Maya Luna Stella Hazel Clara Alice Poppy Willow Iris Violet Maisie Freya Elsie Layla Nina
Tessa Bella Julia Kate Ellie Jenny Megan Olive Pearl June Ada Esme Flora Greta Hattie Lena Marta
Nell Priya Rina Sasha Tilly Una Vera Wren Yara Amara Bea Cora Dina Fern Gemma Holly Isla Jade
Kira Leah Mabel Noor Opal Pia Rosa Sienna Talia Uma Zara Aisha Mei Sofia Leila Naomi Ingrid Kiko
""")
BOY_NAMES = words("""
Tom Ben Max Leo Sam Jack Tim Finn Oscar Noah Liam Jake Owen Theo Milo Hugo Eli Adam Ryan Luke
Dan Ethan Harry Toby Alfie Archie Ollie Felix Jasper Rory Arlo Ezra Jonah Kai Levi Mason Nico
Otto Reuben Seth Teddy Vince Wes Zack Amir Bruno Caleb Dev Emil Frank George Henry Ivan Joel Karl
Louis Marco Ned Omar Pablo Quinn Raj Simon Tariq Umar Victor Will Yusuf Abe Carlos Dmitri Enzo
Gus Hiro Isaac Jamal Kofi Lars Malik Nate Pete Ravi Sami Tobias Wyatt Yuri
""")
# Invented names, built from syllables, so the corpus has many rare proper nouns like real stories do.
NAME_ONSETS = words("Bo Pi Ta Mo Lu Fi Ze Ki Ru No Da Wi Sa Gi Po Ny Ve Ja Co Hu")
NAME_CODAS = words("bble ppin mble lo nko sha rry dge ffle nny tch mo bbit xie ro zzle lly ndo")

FAMILY = [
    ("Mom", "she"), ("Dad", "he"), ("Grandma", "she"), ("Grandpa", "he"), ("Aunt Rose", "she"),
    ("Uncle Joe", "he"), ("Nana", "she"), ("Papa", "he"),
]
SIBLINGS = ["big sister", "little sister", "big brother", "little brother", "cousin", "best friend", "neighbor"]

# animal: (plural, young, sound, moves, food, home)
ANIMALS: dict[str, tuple[str, str, str, str, str, str]] = {
    "cat": ("cats", "kitten", "meowed", "tiptoed", "a bowl of milk", "a cozy basket"),
    "dog": ("dogs", "puppy", "barked", "ran", "a crunchy bone", "a wooden doghouse"),
    "rabbit": ("rabbits", "bunny", "squeaked", "hopped", "a fresh carrot", "a burrow under the hedge"),
    "bird": ("birds", "chick", "chirped", "flew", "a handful of seeds", "a nest in the branches"),
    "duck": ("ducks", "duckling", "quacked", "waddled", "some soft bread crumbs", "the reeds by the pond"),
    "frog": ("frogs", "tadpole", "croaked", "leaped", "a buzzing fly", "a lily pad"),
    "squirrel": ("squirrels", "kit", "chattered", "scampered", "a pile of acorns", "a hole in the oak tree"),
    "owl": ("owls", "owlet", "hooted", "glided", "a juicy beetle", "a hollow in the old tree"),
    "turtle": ("turtles", "hatchling", "hissed softly", "crawled", "a green lettuce leaf", "a sunny rock"),
    "mouse": ("mice", "pup", "squeaked", "scurried", "a crumb of cheese", "a tiny hole in the wall"),
    "hedgehog": ("hedgehogs", "hoglet", "snuffled", "shuffled", "a wiggly worm", "a pile of leaves"),
    "fox": ("foxes", "cub", "yipped", "trotted", "a ripe berry", "a den under the roots"),
    "bear": ("bears", "cub", "growled", "lumbered", "a pot of honey", "a big dark cave"),
    "deer": ("deer", "fawn", "snorted", "pranced", "a patch of sweet clover", "a quiet glade"),
    "goat": ("goats", "kid", "bleated", "climbed", "a bunch of hay", "a little barn"),
    "pig": ("pigs", "piglet", "oinked", "trotted", "a bucket of apples", "a muddy pen"),
    "cow": ("cows", "calf", "mooed", "plodded", "a pile of green grass", "the big red barn"),
    "horse": ("horses", "foal", "neighed", "galloped", "a sweet apple", "a warm stable"),
    "sheep": ("sheep", "lamb", "baaed", "wandered", "a bundle of clover", "a grassy field"),
    "hen": ("hens", "chick", "clucked", "pecked", "a scoop of corn", "the henhouse"),
    "penguin": ("penguins", "chick", "squawked", "slid", "a silver fish", "an icy shore"),
    "monkey": ("monkeys", "baby", "chattered", "swung", "a yellow banana", "a tall jungle tree"),
    "elephant": ("elephants", "calf", "trumpeted", "stomped", "a bunch of leaves", "the wide grassland"),
    "lion": ("lions", "cub", "roared", "prowled", "a big meal", "a rocky den"),
    "giraffe": ("giraffes", "calf", "hummed", "strolled", "the leaves at the top of a tree", "the open plain"),
    "panda": ("pandas", "cub", "bleated", "rolled", "a stalk of bamboo", "a bamboo forest"),
    "koala": ("koalas", "joey", "grunted", "clung", "a few gum leaves", "a eucalyptus tree"),
    "kangaroo": ("kangaroos", "joey", "grunted", "bounced", "some dry grass", "the red desert"),
    "seal": ("seals", "pup", "barked", "flopped", "a slippery fish", "a rocky beach"),
    "whale": ("whales", "calf", "sang", "swam", "a cloud of tiny krill", "the deep blue sea"),
    "dolphin": ("dolphins", "calf", "clicked", "swam", "a shiny fish", "the warm sea"),
    "crab": ("crabs", "baby crab", "clicked", "scuttled", "a bit of seaweed", "a rock pool"),
    "snail": ("snails", "baby snail", "said nothing", "crept", "a wet leaf", "a shell on its back"),
    "bee": ("bees", "baby bee", "buzzed", "zoomed", "sweet nectar", "a golden hive"),
    "butterfly": ("butterflies", "caterpillar", "fluttered", "fluttered", "nectar from a flower", "a flower bush"),
    "ladybug": ("ladybugs", "baby ladybug", "said nothing", "crawled", "a tiny aphid", "a rose leaf"),
    "ant": ("ants", "baby ant", "said nothing", "marched", "a crumb of sugar", "an anthill"),
    "spider": ("spiders", "spiderling", "said nothing", "crawled", "a little fly", "a silky web"),
    "bat": ("bats", "pup", "squeaked", "swooped", "a moth", "a dark barn roof"),
    "raccoon": ("raccoons", "kit", "chittered", "crept", "a handful of berries", "a hollow log"),
    "otter": ("otters", "pup", "squeaked", "swam", "a clam", "a den by the river"),
    "beaver": ("beavers", "kit", "slapped its tail", "paddled", "a stick of willow", "a lodge of sticks"),
    "moose": ("moose", "calf", "bellowed", "waded", "a mouthful of water plants", "the misty marsh"),
    "wolf": ("wolves", "pup", "howled", "loped", "a big bone", "a den in the hills"),
    "parrot": ("parrots", "chick", "squawked", "flew", "a sunflower seed", "a bright cage"),
    "goldfish": ("goldfish", "baby fish", "blew bubbles", "swam", "a pinch of fish flakes", "a glass bowl"),
    "hamster": ("hamsters", "pup", "squeaked", "scurried", "a sunflower seed", "a little cage"),
    "pony": ("ponies", "foal", "neighed", "trotted", "a crunchy carrot", "a small stable"),
    "donkey": ("donkeys", "foal", "brayed", "plodded", "a bale of hay", "a shady shed"),
    "swan": ("swans", "cygnet", "honked", "glided", "some water weeds", "the quiet lake"),
    "robin": ("robins", "chick", "sang", "hopped", "a juicy worm", "a nest in the hedge"),
    "crow": ("crows", "chick", "cawed", "flapped", "a shiny seed", "a high nest"),
    "lizard": ("lizards", "hatchling", "said nothing", "darted", "a little cricket", "a warm stone wall"),
    "dragon": ("dragons", "hatchling", "puffed smoke", "flew", "a basket of peppers", "a mountain cave"),
    "unicorn": ("unicorns", "foal", "whinnied", "galloped", "a golden apple", "a rainbow meadow"),
}
PET_NAMES = words("""
Biscuit Pepper Muffin Coco Buttons Whiskers Sunny Patch Pip Ziggy Noodle Pickles Bean Socks Shadow
Marble Toffee Pebble Fudge Clover Waffles Nutmeg Sprout Tinker Rusty Dotty Scout Gizmo Peanut Bubbles
Honey Maple Acorn Bramble Cricket Domino Ember Figgy Gumdrop Hopper Jellybean Kiwi Lucky Mochi Nibbles
Oreo Pumpkin Quill Raisin Sparky Tango Velvet Wiggles Zippy
""")

# object: (material, can get stuck up high, floats, adjective choices)
OBJECTS: dict[str, tuple[str, bool, bool, str]] = {
    "kite": ("paper", True, False, "red|blue|bright|striped|diamond-shaped|yellow"),
    "ball": ("rubber", True, True, "red|bouncy|blue|spotted|green|shiny"),
    "balloon": ("rubber", True, True, "red|purple|shiny|round|orange|silver"),
    "teddy bear": ("cloth", False, False, "brown|soft|fluffy|old|cuddly|tiny"),
    "toy boat": ("wood", False, True, "little|wooden|blue|painted|tiny|white"),
    "hat": ("cloth", True, True, "straw|red|woolly|floppy|green|striped"),
    "scarf": ("cloth", True, False, "long|striped|woolly|warm|pink|knitted"),
    "doll": ("cloth", False, False, "rag|pretty|small|old|smiling|button-eyed"),
    "drum": ("wood", False, False, "little|loud|red|round|wooden|shiny"),
    "book": ("paper", False, False, "favorite|thick|picture|old|blue|secret"),
    "picture": ("paper", False, False, "colorful|big|lovely|bright|careful|happy"),
    "cup": ("clay", False, True, "yellow|tiny|painted|blue|spotty|favorite"),
    "vase": ("clay", False, False, "tall|blue|painted|pretty|round|flowery"),
    "piggy bank": ("clay", False, False, "pink|heavy|round|shiny|smiling|spotted"),
    "robot": ("metal", False, False, "silver|clever|shiny|tiny|beeping|blue"),
    "toy car": ("metal", False, False, "fast|red|tiny|shiny|racing|green"),
    "train": ("wood", False, False, "wooden|long|red|painted|little|toy"),
    "frisbee": ("plastic", True, True, "orange|green|flat|bright|round|purple"),
    "bucket": ("plastic", False, True, "yellow|sandy|blue|little|red|round"),
    "shovel": ("plastic", False, True, "blue|little|sandy|red|green|tiny"),
    "umbrella": ("cloth", True, True, "yellow|spotted|big|rainbow|black|green"),
    "blanket": ("cloth", False, False, "warm|soft|patchwork|blue|fuzzy|big"),
    "necklace": ("beads", True, False, "shiny|beaded|pretty|long|sparkly|golden"),
    "crown": ("paper", False, False, "golden|paper|sparkly|shiny|tall|royal"),
    "mask": ("paper", False, False, "funny|lion|paper|painted|scary|silly"),
    "sandcastle": ("sand", False, False, "tall|big|proud|grand|sandy|wobbly"),
    "snowman": ("snow", False, False, "big|round|jolly|tall|lumpy|happy"),
    "tower": ("blocks", False, False, "tall|wobbly|wooden|colorful|high|proud"),
    "puzzle": ("paper", False, False, "big|tricky|colorful|jigsaw|new|hard"),
    "jar": ("glass", True, True, "glass|big|clear|cookie|old|round"),
    "lantern": ("glass", True, False, "little|paper|glowing|old|golden|bright"),
    "map": ("paper", True, False, "old|treasure|folded|crinkly|secret|big"),
    "shell": ("shell", False, False, "pink|curly|pretty|white|spotted|smooth"),
    "stone": ("stone", False, False, "smooth|shiny|round|gray|striped|special"),
    "flute": ("wood", False, False, "little|wooden|silver|thin|shiny|new"),
    "bicycle": ("metal", False, False, "red|new|shiny|blue|squeaky|little"),
    "wagon": ("wood", False, False, "red|little|wooden|rusty|big|squeaky"),
    "sweater": ("cloth", True, False, "woolly|red|warm|cozy|striped|green"),
    "sock": ("cloth", True, True, "striped|odd|woolly|red|fuzzy|long"),
    "mitten": ("cloth", True, True, "woolly|blue|warm|red|fuzzy|little"),
    "paper plane": ("paper", True, True, "folded|white|speedy|pointy|small|blue"),
    "feather": ("feather", True, True, "long|white|soft|blue|bright|golden"),
    "whistle": ("metal", False, False, "shiny|silver|loud|little|tin|tiny"),
    "bell": ("metal", True, False, "little|golden|jingly|silver|bright|tiny"),
    "spoon": ("metal", False, False, "silver|wooden|big|shiny|little|old"),
    "basket": ("straw", False, True, "woven|picnic|little|round|big|brown"),
    "rope": ("rope", True, False, "long|strong|thick|old|knotted|yellow"),
    "clock": ("metal", False, False, "ticking|old|round|golden|little|loud"),
    "telescope": ("metal", False, False, "brass|long|shiny|old|little|new"),
    "compass": ("metal", False, False, "old|brass|little|shiny|round|silver"),
}
MEND = {
    "paper": ("tore", "some sticky tape", "taped"),
    "cloth": ("ripped", "a needle and thread", "sewed up"),
    "wood": ("cracked", "some wood glue", "glued"),
    "clay": ("broke into pieces", "some strong glue", "glued"),
    "rubber": ("got a hole", "a little patch", "patched"),
    "metal": ("got bent", "a small hammer", "hammered straight"),
    "plastic": ("cracked", "some strong tape", "taped"),
    "beads": ("snapped", "a new string", "restrung"),
    "sand": ("crumbled", "a bucket of wet sand", "rebuilt"),
    "snow": ("melted a little", "fresh snow", "patted back together"),
    "blocks": ("fell down", "a wider base", "rebuilt"),
    "glass": ("cracked", "clear glue", "glued"),
    "shell": ("chipped", "a dab of glue", "glued"),
    "stone": ("chipped", "a bit of polish", "polished"),
    "feather": ("got bent", "a warm steamy cloth", "smoothed"),
    "straw": ("came apart", "some new straw", "wove back together"),
    "rope": ("frayed", "a tight knot", "tied"),
}
# place: (preposition phrase, features '|'-separated, activities '|'-separated)
PLACES: dict[str, tuple[str, str, str]] = {
    "park": ("at the park", "a tall slide|squeaky swings|a sandbox|a duck pond|old oak trees|a green bench|a fountain",
             "played on the swings|slid down the slide|built a castle in the sandbox|fed the ducks"),
    "garden": ("in the garden", "tall sunflowers|buzzing bees|a vegetable patch|a little shed|a stone path|rose bushes|a bird bath",
               "watered the flowers|picked ripe tomatoes|dug for worms|watched the bees"),
    "forest": ("in the forest", "tall pine trees|a mossy log|a bubbling stream|red mushrooms|soft ferns|a hollow stump|singing birds",
               "collected pinecones|followed the stream|looked for mushrooms|listened to the birds"),
    "beach": ("at the beach", "golden sand|rolling waves|rock pools|seagulls|a striped lighthouse|seashells|a wooden pier",
              "built a sandcastle|splashed in the waves|collected shells|looked in the rock pools"),
    "farm": ("on the farm", "a red barn|muddy pigs|a tractor|a hay loft|white fences|a duck pond|rows of corn",
             "fed the chickens|rode on the tractor|collected eggs|jumped in the hay"),
    "kitchen": ("in the kitchen", "a big oven|a wooden table|shiny pots|a cookie jar|a warm stove|a fruit bowl|a window full of plants",
                "baked cookies|washed the dishes|made a sandwich|stirred the soup"),
    "school": ("at school", "a busy classroom|a big blackboard|a reading corner|a playground|rows of desks|a fish tank|paintings on the walls",
               "read stories|painted pictures|sang songs|counted shells"),
    "library": ("at the library", "tall shelves|quiet tables|a story rug|a big globe|comfy chairs|picture books|a friendly librarian",
                "read picture books|listened to a story|looked at the globe|chose three books"),
    "pond": ("by the pond", "green lily pads|tall reeds|a wooden bridge|dragonflies|smooth stones|croaking frogs|a little island",
             "skipped stones|watched the frogs|counted the ducks|sailed a leaf boat"),
    "hill": ("on the hill", "soft grass|a windy top|a lonely tree|wild flowers|a view of the town|a winding path|big white clouds",
             "rolled down the grass|flew a kite|watched the clouds|ran to the top"),
    "meadow": ("in the meadow", "wild flowers|tall grass|butterflies|a little brook|hopping crickets|a big rock|clover patches",
               "picked daisies|chased butterflies|made flower crowns|lay in the grass"),
    "river": ("by the river", "fast water|a stone bridge|fishing boats|smooth pebbles|willow trees|a sandy bank|jumping fish",
              "threw pebbles|watched the boats|dipped their toes|looked for fish"),
    "cave": ("in the cave", "dark corners|dripping water|shiny rocks|sleeping bats|a cold breeze|echoes|a narrow tunnel",
             "shouted to hear the echo|shone a flashlight|looked at the shiny rocks|tiptoed past the bats"),
    "market": ("at the market", "colorful stalls|piles of apples|a flower stand|a cheese seller|loud voices|baskets of bread|a man with balloons",
               "bought apples|smelled the flowers|tasted the cheese|counted coins"),
    "zoo": ("at the zoo", "tall giraffes|sleepy lions|a penguin pool|noisy monkeys|a big elephant|a snack stand|a reptile house",
            "watched the penguins|waved at the monkeys|fed the goats|looked at the lions"),
    "playground": ("at the playground", "a climbing frame|a merry-go-round|a seesaw|a rope bridge|a tunnel slide|a sandpit|monkey bars",
                   "climbed the frame|went on the seesaw|crossed the rope bridge|swung on the monkey bars"),
    "bakery": ("at the bakery", "warm bread|sweet buns|a big oven|cakes in the window|a bell on the door|flour everywhere|a smiling baker",
               "chose a bun|watched the baker|smelled the bread|bought a cake"),
    "attic": ("in the attic", "old boxes|a dusty trunk|cobwebs|a round window|forgotten toys|a rocking horse|piles of books",
              "opened the old trunk|found forgotten toys|looked out the window|tried on old hats"),
    "backyard": ("in the backyard", "a tree house|a swing|a vegetable bed|a sandpit|a washing line|a little fence|a bird feeder",
                 "climbed into the tree house|played on the swing|hung up the washing|filled the bird feeder"),
    "lake": ("at the lake", "calm water|a wooden dock|a rowing boat|tall pines|swimming ducks|a sandy shore|a small island",
             "rowed the boat|swam near the shore|fed the ducks|fished from the dock"),
    "castle": ("at the castle", "high towers|a wooden drawbridge|a deep moat|flags on the walls|a great hall|stone stairs|a secret door",
               "crossed the drawbridge|climbed the stairs|looked from the tower|explored the great hall"),
    "village": ("in the village", "little houses|a clock tower|a well|a bakery|cobbled streets|a village green|a duck pond",
                "visited the baker|looked at the clock tower|drew water from the well|played on the green"),
    "island": ("on the island", "palm trees|white sand|a blue lagoon|coconuts|a hidden cove|crabs on the rocks|a tall lookout rock",
               "looked for coconuts|swam in the lagoon|explored the cove|climbed the lookout rock"),
    "mountain": ("on the mountain", "snowy peaks|a rocky path|mountain goats|a cold stream|tall pines|a wooden hut|eagles overhead",
                 "climbed the path|drank from the stream|watched the goats|rested at the hut"),
    "bedroom": ("in the bedroom", "a soft bed|a toy box|a bookshelf|a night light|a window seat|a fluffy rug|posters of stars",
                "read a book|built a blanket fort|tidied the toys|looked at the stars"),
    "living room": ("in the living room", "a big sofa|a crackling fire|a soft rug|a piano|a tall lamp|family photos|a basket of toys",
                    "built a pillow fort|played the piano|did a puzzle|sat by the fire"),
    "bus stop": ("at the bus stop", "a red bench|a timetable|a tall sign|puddles|people with umbrellas|a rubbish bin|a painted shelter",
                 "waited for the bus|counted the cars|splashed in the puddles|read the timetable"),
    "train station": ("at the train station", "long platforms|a big clock|busy people|a ticket office|shiny tracks|a cafe|a whistling guard",
                      "watched the trains|bought tickets|waved at the driver|listened to the whistle"),
    "harbor": ("at the harbor", "fishing boats|seagulls|lobster pots|a tall crane|ropes and nets|a lighthouse|a fish shop",
               "watched the boats|counted the seagulls|looked at the nets|waved to the fishermen"),
    "orchard": ("in the orchard", "apple trees|pear trees|a wooden ladder|buzzing wasps|baskets of fruit|long grass|a little gate",
                "picked apples|climbed the ladder|filled the baskets|ate a juicy pear"),
    "swamp": ("in the swamp", "murky water|twisty trees|hanging moss|croaking frogs|a wooden boardwalk|fireflies|a sleepy turtle",
              "walked on the boardwalk|listened to the frogs|watched the fireflies|looked for turtles"),
    "desert": ("in the desert", "hot sand|tall cactus plants|red rocks|a quiet lizard|a shady oasis|rolling dunes|a blazing sun",
               "climbed a dune|rested at the oasis|looked for lizards|watched the sunset"),
    "jungle": ("in the jungle", "giant leaves|hanging vines|noisy parrots|a rushing waterfall|bright flowers|swinging monkeys|a muddy path",
               "swung on the vines|listened to the parrots|found the waterfall|followed the muddy path"),
    "museum": ("at the museum", "dinosaur bones|old paintings|a rocket|glass cases|a golden statue|a mummy|a giant globe",
               "looked at the dinosaur bones|drew the paintings|sat in the rocket|read the signs"),
    "circus": ("at the circus", "a striped tent|juggling clowns|a tightrope|prancing horses|popcorn|bright lights|a brass band",
               "watched the clowns|ate popcorn|clapped for the acrobats|laughed at the jokes"),
    "toy shop": ("at the toy shop", "shelves of toys|a rocking horse|model trains|puzzles|dolls in boxes|spinning tops|a friendly shopkeeper",
                 "looked at the trains|spun a top|hugged a teddy|chose a puzzle"),
    "snowy field": ("in the snowy field", "deep snow|frozen puddles|a snowy hill|icicles on the fence|animal tracks|a gray sky|sledges",
                    "built a snowman|rode a sledge|made snow angels|followed the tracks"),
    "pumpkin patch": ("at the pumpkin patch", "round pumpkins|a scarecrow|hay bales|twisty vines|orange leaves|a tractor ride|a cider stand",
                      "chose a pumpkin|rode the tractor|climbed the hay bales|waved at the scarecrow"),
}
TOWN_STARTS = words("Willow Maple Pine River Stone Oak Apple Honey Sunny Misty Cedar Fern Clover Amber Silver Berry Rose Bramble Thistle Pebble")
TOWN_ENDS = words("brook wood field hill dale ton ford vale bury mere haven glen wick cross moor")

FOODS = words("""
apple banana cherry grape pear plum peach orange lemon melon strawberry blueberry raspberry cookie
cake muffin pancake waffle sandwich pizza soup noodles rice bread toast cheese carrot pea potato
corn tomato cucumber pie cupcake donut pretzel popcorn honey jam yogurt porridge omelet biscuit
""")
# baked/made food: (ingredients, steps)
RECIPES: dict[str, tuple[str, str]] = {
    "cake": ("flour|sugar|eggs|butter|milk", "mixed the flour and sugar|cracked the eggs|stirred in the milk|poured it into a pan|baked it in the oven"),
    "cookies": ("flour|butter|sugar|chocolate chips|an egg", "mixed the butter and sugar|added the flour|rolled the dough into balls|put them on a tray|baked them until golden"),
    "pancakes": ("flour|milk|eggs|a pinch of salt|butter", "whisked the eggs and milk|added the flour|heated the pan|poured the batter|flipped each pancake"),
    "pizza": ("dough|tomato sauce|cheese|mushrooms|peppers", "rolled out the dough|spread the sauce|sprinkled the cheese|added the toppings|baked it until it bubbled"),
    "bread": ("flour|water|yeast|salt|a spoon of honey", "mixed the flour and water|kneaded the dough|let it rise|shaped a loaf|baked it until it was brown"),
    "soup": ("carrots|potatoes|onions|water|peas", "washed the vegetables|chopped them into pieces|put them in a big pot|poured in the water|let it bubble slowly"),
    "muffins": ("flour|blueberries|sugar|milk|an egg", "mixed the flour and sugar|stirred in the milk and egg|folded in the blueberries|filled the paper cups|baked them"),
    "lemonade": ("lemons|water|sugar|ice|a sprig of mint", "squeezed the lemons|poured in the water|stirred in the sugar|added the ice|tasted it"),
    "fruit salad": ("apples|grapes|bananas|strawberries|a spoon of honey", "washed the fruit|cut it into pieces|put it in a bowl|drizzled the honey|mixed it gently"),
    "sandwiches": ("bread|butter|cheese|cucumber|tomatoes", "buttered the bread|sliced the cheese|added the cucumber|put on the tomatoes|cut them into triangles"),
}
MISHAPS = [
    ("used salt instead of sugar", "it tasted very salty", "made a new batch with sugar"),
    ("spilled the flour all over the floor", "there was not enough left", "went to the shop for more flour"),
    ("left it in the oven too long", "the edges were burnt", "cut off the burnt edges"),
    ("dropped the bowl", "it landed upside down", "cleaned up and started again"),
    ("forgot to set the timer", "it was not ready", "waited and checked again"),
    ("let the dog into the kitchen", "the dog ate a piece", "made a little extra"),
]

COLORS = words("red blue green yellow purple orange pink brown black white gray golden silver")
TRAITS = words("""
kind brave shy clever curious gentle cheerful grumpy silly careful helpful friendly playful quiet
noisy bold proud patient stubborn sleepy busy thoughtful honest generous polite cheeky dreamy
""")
SIZES = words("little small tiny big tall huge")
FEELINGS = {
    "happy": words("smiled grinned laughed giggled beamed"),
    "sad": words("sniffled sighed frowned pouted sobbed"),
    "scared": words("shivered trembled gasped froze shook"),
    "excited": words("jumped clapped cheered squealed bounced"),
    "proud": words("beamed smiled stood tall grinned nodded"),
    "surprised": words("gasped blinked stared jumped gaped"),
    "angry": words("stomped huffed scowled frowned grumbled"),
}
OPENINGS = phrases("""
Once upon a time|One sunny morning|One rainy afternoon|One day|Long ago|Last summer|One cold winter morning|
Early one morning|One windy day|One spring day|On a bright Saturday|One quiet evening|One snowy day|
One warm afternoon|In a land far away|Not long ago|On a cloudy morning|One autumn day|After breakfast one day|
On the first day of the holidays
""")
WEATHER = {
    "sunny": ("the sun was shining", "warm and bright"),
    "rainy": ("rain was tapping on the windows", "wet and gray"),
    "windy": ("the wind was blowing hard", "wild and windy"),
    "snowy": ("snow was falling softly", "cold and white"),
    "foggy": ("a thick fog covered everything", "misty and quiet"),
    "cloudy": ("big clouds rolled across the sky", "cool and gray"),
}
FEARS = {
    "the dark": ("the night light went out", "the dark is just the room with the lights off", "counted the stars outside the window",
                 "the shadows were only a chair, a coat and a toy box"),
    "thunder": ("a loud crash of thunder shook the windows", "thunder is the sound of clouds bumping together", "counted the seconds between the flash and the bang",
                "the storm grew quieter and moved far away"),
    "the big dog next door": ("the big dog barked at the fence", "the dog barks because it wants to play", "held out a hand very slowly",
                              "the dog only wanted to lick a hand and wag its tail"),
    "deep water": ("the water came up to the waist", "we can float if we stay calm", "lay back and kicked slowly",
                   "the water held them up like a soft bed"),
    "the tall slide": ("the top of the slide looked very high", "we can go down slowly and hold the sides", "sat down and held on tight",
                       "the ride down was fast and fun"),
    "bees": ("a bee buzzed near a nose", "bees only want flowers, not people", "stood still like a tree",
             "the bee flew away to a flower"),
    "the first day at school": ("the big doors of the school opened", "everyone feels nervous on the first day", "said hello to the girl at the next desk",
                                "the new friend liked the same games"),
    "the doctor": ("the doctor came in with a cold stethoscope", "doctors help us stay healthy", "took a deep breath and held still",
                   "the check-up was over in a minute"),
}
LESSONS = {
    "lost": phrases("always put your things back where they belong|it helps to look carefully and not give up|friends make every search easier"),
    "broken": phrases("almost anything can be fixed with patience|being careful keeps our things safe|it is okay to ask for help"),
    "stuck": phrases("when you cannot reach something, ask for help|thinking carefully works better than jumping|small friends can be great helpers"),
    "fear": phrases("being brave means trying even when you feel scared|scary things are often less scary when we understand them|a kind word can chase fears away"),
    "share": phrases("sharing makes fun twice as big|taking turns is fair for everyone|a friend is better than a toy"),
    "animal": phrases("being kind to animals is important|every creature needs a home|gentle hands are helping hands"),
    "bake": phrases("mistakes are part of learning|good things take time|food tastes best when you share it"),
    "weather": phrases("a change of plans can still be fun|there is always a rainbow after the rain|fun can happen anywhere"),
    "race": phrases("slow and steady can win the race|doing your best is what counts|cheering for friends feels good"),
    "explore": phrases("the world is full of surprises|curious minds find wonderful things|every trip is an adventure"),
}
SEARCH_SPOTS = phrases("""
under the bed|behind the sofa|in the toy box|inside the wardrobe|under the kitchen table|behind the curtains|
in the laundry basket|on the bookshelf|in the garden shed|under a pile of leaves|behind the door|in the bathtub|
inside a boot|under the stairs|in the car|behind the flower pot|in the dog's basket|on the window sill
""")
HIGH_SPOTS = phrases("high in the old oak tree|on the roof of the shed|on top of the tall wardrobe|up on the garage roof|in the branches of the apple tree|on top of the fence|on a high shelf")
SAYING = words("said asked whispered shouted called answered replied cried laughed added")
ADVERBS = words("quickly slowly carefully happily quietly loudly gently suddenly bravely softly proudly sadly")
TIMEWORDS = phrases("After a while|Soon|Then|Just then|A moment later|Later|After lunch|Before long|At last|Suddenly")
RACE_PLACES = phrases("to the big tree|to the top of the hill|around the pond|to the garden gate|across the meadow|to the old bridge")
EXPLORE_FINDS = phrases("""
a shiny blue stone|an old bottle with a note inside|a tiny golden key|a bird's nest with three speckled eggs|a map drawn on a leaf|
a hidden door covered in ivy|a ring of white mushrooms|a fossil shaped like a shell|a wooden box with a brass lock|a feather as long as an arm
""")
